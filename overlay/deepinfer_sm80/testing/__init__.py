"""Reusable test harnesses: Ampere AOT fitness, memory poisoning, comparisons."""
