"""Text rules the core shares: markdown lines, and Lamina's block markup and escaping."""
