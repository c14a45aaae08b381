"""A Hugging Face ``datasets`` streaming job: JSON lines in two files, ``load_dataset(...,
streaming=True)``, a per-example Python map (a hashed bag of words), a shuffle buffer, read by a
torch DataLoader with one worker; the model is a small MLP, so the map is the loading time.

``--batched`` does what loadprof's ``hf_batched_map`` advice says: ``map(batched=True)`` with the
same features computed over the whole batch with array operations (``np.add.at``); the
features are the same.

One of the realistic scripts benchmarks/advice_accuracy.py measures the advice on.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import numpy as np
import torch
from datasets import load_dataset

ROWS, FILES, DIM, ROUNDS = 2048, 2, 64, 40


def write(folder: str) -> list[str]:
    os.makedirs(folder, exist_ok=True)
    paths = [os.path.join(folder, f"part-{f}.jsonl") for f in range(FILES)]
    for f, path in enumerate(paths):
        if not os.path.exists(path):
            with open(path + ".tmp", "w") as out:
                for i in range(f, ROWS, FILES):
                    words = " ".join(str((i * 7 + j) % 997) for j in range(32))
                    out.write(json.dumps({"text": words, "label": i % 4}) + "\n")
            os.replace(path + ".tmp", path)
    return paths


def featurize(example):
    vec = np.zeros(DIM, dtype=np.float32)
    for _ in range(ROUNDS):
        for word in example["text"].split():
            vec[int(word) % DIM] += 1.0
    return {"x": vec / ROUNDS}


def featurize_batched(batch):
    ids = [np.array(t.split(), dtype=np.int64) % DIM for t in batch["text"]]
    out = np.zeros((len(ids), DIM), dtype=np.float32)
    rows = np.repeat(np.arange(len(ids)), [len(i) for i in ids])
    np.add.at(out, (rows, np.concatenate(ids)), 1.0)
    return {"x": list(out)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--batched", action="store_true")
    parser.add_argument("--shuffle-buffer", type=int, default=64)
    args = parser.parse_args()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    files = write(os.path.join(tempfile.gettempdir(), "loadprof-hf-stream"))
    ds = load_dataset("json", data_files=files, split="train", streaming=True)
    if args.batched:
        ds = ds.map(featurize_batched, batched=True, batch_size=64, remove_columns=["text"])
    else:
        ds = ds.map(featurize, remove_columns=["text"])
    ds = ds.shuffle(seed=0, buffer_size=args.shuffle_buffer)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(ds, batch_size=32, num_workers=args.workers)
    model = torch.nn.Sequential(torch.nn.Linear(DIM, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(args.epochs):
        ds.set_epoch(epoch)
        for batch in loader:
            loss = torch.nn.functional.cross_entropy(model(batch["x"]), batch["label"])
            opt.zero_grad()
            loss.backward()
            opt.step()


if __name__ == "__main__":
    main()
