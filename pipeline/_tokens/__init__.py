"""Token counting: encodings, the counter and its piece rule, model profiles."""
