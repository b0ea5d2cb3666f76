"""One turn's working state (the artifact graph) and its assembly into layers."""
