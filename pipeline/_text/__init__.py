"""Text rules the core shares: markdown lines (fences, headings, sections), Lamina block markup."""
