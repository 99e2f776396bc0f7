"""A tiny calculator: the repository the agentic example's agent fixes."""


def add(a, b):
    return a - b


def mul(a, b):
    return a * b


def clamp(x, low, high):
    return max(low, min(x, high))
