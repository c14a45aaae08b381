"""A text-classification job whose dataset tokenizes each sentence in Python (a
greedy longest-match over a subword vocabulary, as a pure-Python WordPiece does),
pads to a fixed length and returns ids; the model is an embedding bag and two
layers, so the step is short and the tokenizer is the loading time.

``--batched`` does what loadprof's ``batched_getitems`` advice says: the dataset's
``__getitems__(indices)`` tokenizes a batch's sentences at once with array operations
(the same greedy longest match, run over all the batch's words together) and returns
the stacked (B, MAX_LEN) ids, which the collate passes through; the ids are the same.

One of the realistic scripts benchmarks/advice_accuracy.py measures the advice on.
"""

from __future__ import annotations

import argparse
import random

import numpy as np
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


class BatchTokenizer:
    """Tokenizer's greedy longest match over many words at once. A piece of letters is
    the integer of its letters in base 27 (a = 1 ... z = 26), exact for any piece, so a
    lookup is a search in the sorted keys. Each round takes the next piece of every
    unfinished word: as many rounds as the longest word has pieces. The vocabulary has
    no "##" continuation pieces, so a piece's id is the same at any position, as in
    Tokenizer."""

    def __init__(self, vocab: dict[str, int]) -> None:
        self.longest = max(len(p) for p in vocab)
        self.code = np.zeros(256, dtype=np.int64)
        for i, c in enumerate(LETTERS):
            self.code[ord(c)] = i + 1
        keys = np.array([self._key(p) for p in vocab], dtype=np.int64)
        order = np.argsort(keys)
        self.keys = keys[order]
        self.ids = np.array(list(vocab.values()), dtype=np.int64)[order]

    def _key(self, piece: str) -> int:
        key = 0
        for c in piece:
            key = key * 27 + int(self.code[ord(c)])
        return key

    def __call__(self, texts: list[str]) -> torch.Tensor:
        words_of = [t.split() for t in texts]
        words = [w for ws in words_of for w in ws]
        owner = np.repeat(np.arange(len(texts)), [len(ws) for ws in words_of])
        raw = np.array(words, dtype="S")  # as wide as the longest word, zero-padded
        width = raw.dtype.itemsize
        raw = raw.view(np.uint8).reshape(len(words), width)
        codes = np.pad(self.code[raw], ((0, 0), (0, self.longest)))  # 0 past a word's end
        lengths = (raw > 0).sum(axis=1)
        pieces = np.full((len(words), width), -1, dtype=np.int64)  # a word has at most width pieces
        live = np.arange(len(words))
        start = np.zeros(len(words), dtype=np.int64)
        for slot in range(width):
            if not len(live):
                break
            window = codes[live[:, None], start[:, None] + np.arange(self.longest)]
            key = np.zeros(len(live), dtype=np.int64)
            taken = np.zeros(len(live), dtype=np.int64)
            ids = np.zeros(len(live), dtype=np.int64)
            for n in range(1, self.longest + 1):  # longer matches overwrite shorter ones
                key = key * 27 + window[:, n - 1]
                at = np.minimum(np.searchsorted(self.keys, key), len(self.keys) - 1)
                hit = (self.keys[at] == key) & (start + n <= lengths[live])
                taken[hit] = n
                ids[hit] = self.ids[at[hit]]
            pieces[live, slot] = ids
            start += taken
            going = start < lengths[live]
            live, start = live[going], start[going]
        kept = pieces >= 0
        flat = pieces[kept]  # word by word, piece by piece: each text's ids in order
        text = np.repeat(owner, kept.sum(axis=1))
        first = np.searchsorted(text, np.arange(len(texts)))
        position = np.arange(len(flat)) - first[text]
        fits = position < MAX_LEN
        out = np.zeros((len(texts), MAX_LEN), dtype=np.int64)
        out[text[fits], position[fits]] = flat[fits]
        return torch.from_numpy(out)


def passthrough(batch):
    """The collate for a dataset whose __getitems__ returns the batch already stacked."""
    return batch


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


class BatchedSentences(Sentences):
    """Sentences whose batches are made at once (the batched_getitems advice)."""

    def __init__(self, n: int, tokenizer: BatchTokenizer, seed: int = 0) -> None:
        super().__init__(n, tokenizer, seed)  # type: ignore[arg-type]
        self.label_array = torch.tensor(self.labels, dtype=torch.long)

    def __getitems__(self, indices: list[int]):
        return self.tokenizer([self.texts[i] for i in indices]), self.label_array[indices]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--batched", action="store_true",
                        help="tokenize whole batches in a __getitems__ (the batched_getitems advice)")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    vocab = make_vocab(random.Random(1), 4000)
    if args.batched:
        loader = DataLoader(BatchedSentences(args.samples, BatchTokenizer(vocab)), batch_size=32, shuffle=True,
                            num_workers=args.workers, collate_fn=passthrough)
    else:
        loader = DataLoader(Sentences(args.samples, Tokenizer(vocab)), batch_size=32, shuffle=True,
                            num_workers=args.workers)
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
