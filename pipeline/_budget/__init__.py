"""Fitting a turn into the window: cuts, their order and the budget report."""
