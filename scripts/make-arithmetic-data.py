#!/usr/bin/env python3
"""The data of `make demo-rl` (scripts/demo-rl.sh): problems of a built-in GRPO task (src/rl/rewards.cc),
generated exactly as `crucible grpo` generates them (MakeProblem: splitmix64 of seed and index), with
worked answers.

  make-arithmetic-data.py OUT [--task sum_digits|addition] [--pretrain N] [--sft N] [--heldout N]
                         [--digits LOW-HIGH] [--grpo N]

writes into OUT:
  pretrain.jsonl  N documents {"text": prompt + "\\n" + worked answer}, problems (seed 1, 0..N-1)
  sft-train.jsonl N {"prompt": ..., "completion": worked answer}, problems (seed 2, 0..N-1)
  heldout.jsonl   N {"prompt": ..., "answer": ...}, problems (seed 3, 0..N-1), never trained on
                  (`crucible grpo` draws its problems from debug.seed, which demo-rl.sh sets to 4)
  grpo-prompts.jsonl  with --digits other than 2-8 only: N {"prompt", "answer"} (seed 4), for
                  grpo.prompts (the built-in check scores a prompts file's "answer")
The worked answer of "What is the sum of the digits of 48213? ..." is
  4+8=12 12+2=14 14+1=15 15+3=18
  Answer: 18
(a running sum, one digit at a time); of "What is 482 + 9317? ...", the column sums from the right
  2+7=9 8+1=9 4+3=7 0+9=9
  Answer: 9799
Deterministic: the same arguments give the same bytes.
"""
import argparse
import json
import os

MASK = (1 << 64) - 1
INSTRUCTION = ' Finish with a line "Answer: <integer>".'


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


class ProblemRandom:
    """src/rl/rewards.cc's ProblemRandom: a stream of draws that depends only on (seed, index)."""

    def __init__(self, seed, index):
        self.state = splitmix64(splitmix64(seed) ^ index)

    def uniform(self, low, high):
        self.state = splitmix64(self.state)
        return low + self.state % (high - low + 1)

    def number(self, digits):
        value = self.uniform(0, 9) if digits == 1 else self.uniform(1, 9)
        for _ in range(1, digits):
            value = value * 10 + self.uniform(0, 9)
        return value


def make_problem(task, seed, index, digits=(2, 8)):
    """(prompt, answer, worked answer) as MakeProblem(task, seed, index); `digits`, the range of the
    number's length (sum_digits), is the built-in task's (2, 8) unless narrowed."""
    r = ProblemRandom(seed, index)
    if task == "sum_digits":
        number = r.number(r.uniform(*digits))
        digits = [int(d) for d in str(number)]
        steps, total = [], digits[0]
        for d in digits[1:]:
            steps.append(f"{total}+{d}={total + d}")
            total += d
        prompt = f"What is the sum of the digits of {number}?{INSTRUCTION}"
        return prompt, str(total), " ".join(steps) + f"\nAnswer: {total}"
    a = r.number(r.uniform(1, 6))
    b = r.number(r.uniform(1, 6))
    da, db = str(a)[::-1], str(b)[::-1]
    steps, carry = [], 0
    for i in range(max(len(da), len(db))):
        x, y = int(da[i]) if i < len(da) else 0, int(db[i]) if i < len(db) else 0
        s = x + y + carry
        steps.append(f"{x}+{y}{'+1' if carry else ''}={s}")
        carry = s // 10
    prompt = f"What is {a} + {b}?{INSTRUCTION}"
    return prompt, str(a + b), " ".join(steps) + f"\nAnswer: {a + b}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--task", default="sum_digits", choices=["sum_digits", "addition"])
    p.add_argument("--pretrain", type=int, default=20000)
    p.add_argument("--sft", type=int, default=4000)
    p.add_argument("--heldout", type=int, default=200)
    p.add_argument("--digits", default="2-8",
                   help="sum_digits: the range of the number's length, LOW-HIGH (the built-in task's "
                        "is 2-8; a narrower one also writes grpo-prompts.jsonl for grpo.prompts)")
    p.add_argument("--grpo", type=int, default=4000,
                   help="prompts in grpo-prompts.jsonl (seed 4), written when --digits is not 2-8")
    args = p.parse_args()
    try:
        low, high = (int(x) for x in args.digits.split("-"))
        assert 1 <= low <= high <= 18
    except (ValueError, AssertionError):
        p.error(f"--digits {args.digits}: expected LOW-HIGH with 1 <= LOW <= HIGH <= 18, e.g. 2-4")
    os.makedirs(args.out, exist_ok=True)

    def write(name, rows):
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)

    problems = lambda seed, n: (make_problem(args.task, seed, i, (low, high)) for i in range(n))
    write("pretrain.jsonl", ({"text": f"{q}\n{w}"} for q, _, w in problems(1, args.pretrain)))
    write("sft-train.jsonl", ({"prompt": q, "completion": w} for q, _, w in problems(2, args.sft)))
    write("heldout.jsonl", ({"prompt": q, "answer": a} for q, a, _ in problems(3, args.heldout)))
    if (low, high) != (2, 8):  # crucible grpo's own problems have 2 to 8 digits
        write("grpo-prompts.jsonl",
              ({"prompt": q, "answer": a} for q, a, _ in problems(4, args.grpo)))
    print(f"{args.task}: {args.pretrain} pre-training documents, {args.sft} SFT pairs, "
          f"{args.heldout} held-out prompts in {args.out}")


if __name__ == "__main__":
    main()
