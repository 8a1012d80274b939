"""Steering: live feature strengths, profiles, and the hooks that apply them."""
