"""Starts the whole stack as host processes (`stack`) and the `symbiosis` command (`cli`).
Nothing in the project imports it.
"""
