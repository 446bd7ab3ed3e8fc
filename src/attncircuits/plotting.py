"""Figures and token-highlight HTML. Functions here draw what they are given; they compute nothing."""
