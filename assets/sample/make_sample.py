"""Writes assets/sample/chat.jsonl: short synthetic chat conversations for the CPU demo and tests.

Deterministic (fixed seed, no dependencies beyond the standard library):
    python3 assets/sample/make_sample.py
Then regenerate the pre-tokenized copy with the tiny tokenizer:
    cargo run --release --example prepare -- --model assets/tiny \
        --data assets/sample/chat.jsonl --out assets/sample/tokens.jsonl --labels assistant_only

Tasks: arithmetic, capitals, unit conversions, string reversal, word counting. Some conversations
have a system prompt, some are multi-turn, a few have a thinking-channel span in the assistant
content (the Gemma 4 template strips it) or two consecutive assistant messages.
"""

import json
import os
import random

SEED = 20240601
N_CONVERSATIONS = 400

CAPITALS = [
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
    ("Portugal", "Lisbon"), ("Japan", "Tokyo"), ("Canada", "Ottawa"), ("Australia", "Canberra"),
    ("Brazil", "Brasilia"), ("Egypt", "Cairo"), ("Kenya", "Nairobi"), ("India", "New Delhi"),
    ("Norway", "Oslo"), ("Sweden", "Stockholm"), ("Poland", "Warsaw"), ("Greece", "Athens"),
    ("Peru", "Lima"), ("Chile", "Santiago"), ("Mexico", "Mexico City"), ("Austria", "Vienna"),
]
SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "Answer briefly.",
    "You are a careful tutor. Give the answer first.",
    "Reply with one short sentence.",
]
WORDS = ["apple", "river", "stone", "garden", "planet", "window", "silver", "candle", "forest", "mirror"]
UNITS = [
    ("kilometers", "meters", 1000), ("meters", "centimeters", 100), ("kilograms", "grams", 1000),
    ("hours", "minutes", 60), ("minutes", "seconds", 60), ("liters", "milliliters", 1000),
]


def arithmetic(rng):
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    op = rng.choice(["+", "-", "*"])
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"What is {a} {op} {b}?", f"{a} {op} {b} = {value}."


def capital(rng):
    country, city = rng.choice(CAPITALS)
    return f"What is the capital of {country}?", f"The capital of {country} is {city}."


def conversion(rng):
    big, small, factor = rng.choice(UNITS)
    n = rng.randint(1, 12)
    return f"How many {small} are in {n} {big}?", f"{n} {big} is {n * factor} {small}."


def reversal(rng):
    word = rng.choice(WORDS)
    return f"Reverse the word '{word}'.", f"'{word}' reversed is '{word[::-1]}'."


def counting(rng):
    words = rng.sample(WORDS, rng.randint(2, 6))
    return f"How many words are in: {' '.join(words)}?", f"There are {len(words)} words."


TASKS = [arithmetic, capital, conversion, reversal, counting]


def conversation(rng):
    messages = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    for turn in range(rng.choice([1, 1, 1, 2, 3])):
        question, answer = rng.choice(TASKS)(rng)
        if rng.random() < 0.1:
            question = "  " + question + "\n"  # the template trims user content
        if rng.random() < 0.05:
            answer = "<|channel>thought\nLet me check.<channel|>" + answer  # stripped by the template
        messages.append({"role": "user", "content": question})
        messages.append({"role": "assistant", "content": answer})
        if rng.random() < 0.05:
            messages.append({"role": "assistant", "content": "Anything else?"})
    return {"messages": messages}


def main():
    rng = random.Random(SEED)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(N_CONVERSATIONS):
            f.write(json.dumps(conversation(rng), ensure_ascii=False) + "\n")
    print(f"wrote {N_CONVERSATIONS} conversations to {path}")


if __name__ == "__main__":
    main()
