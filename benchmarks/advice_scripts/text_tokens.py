"""A text-classification job whose dataset tokenizes each sentence in Python (a
greedy longest-match over a subword vocabulary, as a pure-Python WordPiece does),
pads to a fixed length and returns ids; the model is an embedding bag and two
layers, so the step is short and the tokenizer is the loading time.

One of the realistic scripts benchmarks/advice_accuracy.py measures the advice on.
"""

from __future__ import annotations

import argparse
import random

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

LETTERS = "etaoinshrdlcumwfgypbvkjxqz"
MAX_LEN = 128


def make_vocab(rng: random.Random, size: int) -> dict[str, int]:
    vocab = {c: i for i, c in enumerate(LETTERS)}
    while len(vocab) < size:
        piece = "".join(rng.choice(LETTERS[:12]) for _ in range(rng.randint(2, 5)))
        vocab.setdefault(piece, len(vocab))
    return vocab


class Tokenizer:
    def __init__(self, vocab: dict[str, int]) -> None:
        self.vocab = vocab
        self.longest = max(len(p) for p in vocab)

    def __call__(self, text: str) -> list[int]:
        ids: list[int] = []
        for word in text.split():
            start = 0
            while start < len(word):
                for end in range(min(len(word), start + self.longest), start, -1):
                    piece = word[start:end] if start == 0 else "##" + word[start:end]
                    if piece in self.vocab or word[start:end] in self.vocab:
                        ids.append(self.vocab.get(piece, self.vocab.get(word[start:end], 0)))
                        start = end
                        break
        return ids[:MAX_LEN]


class Sentences(Dataset):
    def __init__(self, n: int, tokenizer: Tokenizer, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.texts = [" ".join("".join(rng.choice(LETTERS[:14]) for _ in range(rng.randint(3, 12)))
                               for _ in range(rng.randint(40, 90))) for _ in range(n)]
        self.labels = [rng.randrange(4) for _ in range(n)]
        self.tokenizer = tokenizer

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int):
        ids = self.tokenizer(self.texts[i])
        padded = torch.zeros(MAX_LEN, dtype=torch.long)
        padded[:len(ids)] = torch.tensor(ids, dtype=torch.long)
        return padded, self.labels[i]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = Tokenizer(make_vocab(random.Random(1), 4000))
    loader = DataLoader(Sentences(args.samples, tokenizer), batch_size=32, shuffle=True, num_workers=args.workers)
    net = nn.Sequential(nn.Embedding(4000, 128), nn.Flatten(), nn.Linear(128 * MAX_LEN, 256), nn.ReLU(),
                        nn.Linear(256, 4)).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(args.epochs):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()


if __name__ == "__main__":
    main()
