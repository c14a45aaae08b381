"""loadprof.converters.torch datasets under real DataLoaders: fork and spawn, workers and ranks."""

from __future__ import annotations

import pickle
from collections import Counter

import h5py
import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from loadprof.converters import (  # noqa: E402
    ConvertError,
    ConvertOptions,
    CorruptFileError,
    convert,
    tfrecord,
    tfrecordindex,
)
from loadprof.converters.torch import HDF5Dataset, TFRecordDataset  # noqa: E402
from tests.conftest import to_the_end  # noqa: E402
from tests.convert_helpers import make_image_folder  # noqa: E402

N = 53  # prime, so no split comes out even by accident


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("readers")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((N, 3)).astype(np.float32)
    np.savez(root / "d.npz", id=np.arange(N, dtype=np.int64), x=x, blob=rng.integers(0, 256, (N, 40), dtype=np.uint8))
    convert(root / "d.npz", root / "d.h5", ConvertOptions(to="hdf5"))
    # ~7 records per shard: several shards, the last one short.
    convert(root / "d.npz", root / "tf", ConvertOptions(to="tfrecord", shard_size=700))
    return root, x


def ids_from(loader):
    got = []
    for batch in loader:
        got.extend(batch["id"].reshape(-1).tolist())  # raw Int64List items are 1-D
    return got


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_hdf5_dataset_with_two_workers(data, context):
    root, x = data
    ds = HDF5Dataset(root / "d.h5")
    first = ds[0]  # the parent opens the file before the workers exist
    assert int(first["id"]) == 0 and first["x"].dtype == np.float32
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=context, shuffle=True)
    seen = []
    for batch in loader:
        seen.extend(batch["id"].tolist())
        for i, row in zip(batch["id"].tolist(), batch["x"], strict=True):
            np.testing.assert_array_equal(row.numpy(), x[i])
    assert sorted(seen) == list(range(N))


def test_hdf5_dataset_pickles_after_use_and_reopens(data):
    root, x = data
    ds = HDF5Dataset(root / "d.h5")
    np.testing.assert_array_equal(ds[5]["x"], x[5])
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.reader._file is None  # the handle stayed behind
    np.testing.assert_array_equal(copy[-1]["x"], x[-1])
    assert len(copy) == N


def test_hdf5_bytes_fields_collate_as_lists_of_bytes(tmp_path):
    images = make_image_folder(tmp_path / "imgs", {"a": 3, "b": 2})
    convert(tmp_path / "imgs", tmp_path / "i.h5", ConvertOptions(to="hdf5"))
    batch = next(iter(DataLoader(HDF5Dataset(tmp_path / "i.h5"), batch_size=5)))
    assert batch["image"] == [p.read_bytes() for p, _, _ in images]
    assert batch["label"].tolist() == [0, 0, 0, 1, 1]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_hdf5_encoded_images_through_workers_read_past_h5py(tmp_path, context):
    images = make_image_folder(tmp_path / "imgs", {"a": 6, "b": 5})
    convert(tmp_path / "imgs", tmp_path / "i.h5", ConvertOptions(to="hdf5"))
    ds = HDF5Dataset(tmp_path / "i.h5")
    assert ds[3]["image"] == images[3][0].read_bytes()  # the parent maps the file before forking
    assert ds.reader.direct  # see NOTE [ Direct reads of uncompressed HDF5 data ]
    loader = DataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context=context, shuffle=True)
    got = {}
    for batch in loader:
        for blob, label in zip(batch["image"], batch["label"].tolist(), strict=True):
            got[blob] = label
    assert got == {p.read_bytes(): label for p, label, _ in images}


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_tfrecord_dataset_with_two_workers(data, context):
    root, x = data
    ds = TFRecordDataset(root / "tf")
    assert len(ds.paths) >= 5 and len(ds) == N
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=context)
    seen = []
    for batch in loader:
        seen.extend(batch["id"].tolist())
        for i, row in zip(batch["id"].tolist(), batch["x"], strict=True):
            np.testing.assert_array_equal(row.numpy(), x[i])
    assert Counter(seen) == Counter(range(N))


@pytest.mark.parametrize("shuffle", [False, True])
def test_tfrecord_ranks_times_workers_cover_everything_once(data, shuffle):
    root, _ = data
    world = 3
    per_rank = []
    for rank in range(world):
        ds = TFRecordDataset(root / "tf", rank=rank, world_size=world, shuffle=shuffle, seed=7)
        ids = ids_from(DataLoader(ds, batch_size=3, num_workers=2, multiprocessing_context="fork"))
        assert len(ids) == len(ds)
        per_rank.append(ids)
    everything = [i for ids in per_rank for i in ids]
    assert Counter(everything) == Counter(range(N))
    assert max(map(len, per_rank)) - min(map(len, per_rank)) <= 1


def test_tfrecord_shuffle_changes_with_epoch_and_keeps_the_set(data):
    root, _ = data
    ds = TFRecordDataset(root / "tf", shuffle=True, seed=3)
    epoch0 = [int(s["id"]) for s in ds]
    again = [int(s["id"]) for s in ds]
    ds.set_epoch(1)
    epoch1 = [int(s["id"]) for s in ds]
    assert epoch0 == again and epoch0 != epoch1 and epoch0 != list(range(N))
    assert sorted(epoch0) == sorted(epoch1) == list(range(N))


def test_tfrecord_items_match_the_source(data):
    root, x = data
    items = list(TFRecordDataset(root / "tf"))
    assert [int(s["id"]) for s in items] == list(range(N))
    np.testing.assert_array_equal(np.stack([s["x"] for s in items]), x)
    assert items[0]["blob"].dtype == np.uint8 and items[0]["blob"].shape == (40,)
    assert items[0]["x"].flags.writeable  # torch warns on read-only arrays


def test_tfrecord_crcs_are_checked_by_default(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(20))
    convert(tmp_path / "x.npy", tmp_path / "tf", ConvertOptions(to="tfrecord"))
    shard = next((tmp_path / "tf").glob("*.tfrecord"))
    offsets = tfrecordindex.read_index(tfrecord.index_path_for(shard))[:, 0]
    data = bytearray(shard.read_bytes())
    data[int(offsets[11]) + 14] ^= 0x10
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match=f"corrupt at byte offset {offsets[11]}: data CRC-32C mismatch"):
        list(TFRecordDataset(tmp_path / "tf"))
    with pytest.raises(CorruptFileError, match=f"byte offset {offsets[11]}"):
        list(TFRecordDataset(tmp_path / "tf", shuffle=True))
    # Across a worker the message survives (torch re-raises it by class and text).
    batches = iter(DataLoader(TFRecordDataset(tmp_path / "tf"), num_workers=1, multiprocessing_context="fork"))
    with pytest.raises(Exception, match=f"corrupt at byte offset {offsets[11]}"):
        list(batches)
    to_the_end(batches, Exception)
    err = CorruptFileError(shard, 5, "why")
    assert str(pickle.loads(pickle.dumps(err))) == str(err)


@pytest.mark.tensorflow
def test_reads_files_tensorflow_wrote_without_an_index(tmp_path):
    tf = pytest.importorskip("tensorflow")
    paths = [tmp_path / f"part{i}.tfrecord" for i in range(2)]
    for s, path in enumerate(paths):
        with tf.io.TFRecordWriter(str(path)) as w:
            for i in range(5):
                ex = tf.train.Example(features=tf.train.Features(feature={
                    "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[s * 5 + i])),
                    "name": tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"r{s * 5 + i}".encode()])),
                }))
                w.write(ex.SerializeToString())
    ds = TFRecordDataset([str(p) for p in paths])
    ids = ids_from(DataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="fork"))
    assert sorted(ids) == list(range(10))
    assert next(iter(ds))["name"] == b"r0"


def _distributed_rank(rank, world, init_file, shards, out_dir):
    """One rank of a real gloo process group: read its share through two DataLoader workers."""
    import json

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        ds = TFRecordDataset(shards)  # rank and world size come from torch.distributed
        ids = ids_from(DataLoader(ds, batch_size=3, num_workers=2, multiprocessing_context="fork"))
        (out_dir / f"rank{rank}.json").write_text(json.dumps({"ids": ids, "len": len(ds)}))
    finally:
        dist.destroy_process_group()


def test_tfrecord_ranks_from_torch_distributed(data, tmp_path):
    import json

    import torch.multiprocessing as mp

    root, _ = data
    world = 2
    mp.spawn(_distributed_rank, args=(world, tmp_path / "init", root / "tf", tmp_path), nprocs=world)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for r in results:
        assert len(r["ids"]) == r["len"]
    assert Counter(i for r in results for i in r["ids"]) == Counter(range(N))
    assert {r["len"] for r in results} == {N // 2, N - N // 2}


@pytest.mark.parametrize("shuffle", [False, True])
def test_truncated_shard_with_a_stale_index_is_an_error_not_a_crash(tmp_path, shuffle):
    np.save(tmp_path / "x.npy", np.arange(30))
    convert(tmp_path / "x.npy", tmp_path / "tf", ConvertOptions(to="tfrecord"))
    shard = next((tmp_path / "tf").glob("*.tfrecord"))
    index = tfrecordindex.read_index(tfrecord.index_path_for(shard))
    size = int(index[20][0]) + 5
    shard.write_bytes(shard.read_bytes()[:size])  # cut inside record 20
    # The index no longer ends where the shard does: it is set aside, and the scan
    # that replaces it finds record 20 cut short, before any item is yielded.
    with pytest.warns(RuntimeWarning, match=f"the shard holds {size} bytes; reading {shard.name}"):
        with pytest.raises(CorruptFileError, match=rf"{shard.name}: corrupt at byte offset {index[20][0]}: "
                                                   r"truncated record header \(5 of 12 bytes\)"):
            TFRecordDataset(tmp_path / "tf", shuffle=shuffle)


def _corrupt_offsets(path, i, value):
    with h5py.File(path, "r+") as f:
        f["image/offsets"][i] = value


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("value", [-5, 10**6, 2**62, "decrease"])
def test_hdf5_dataset_never_yields_items_from_corrupt_offsets(tmp_path, workers, value):
    """Checked when the dataset is made and again when each process opens the file."""
    make_image_folder(tmp_path / "imgs", {"a": 4, "b": 4})
    convert(tmp_path / "imgs", tmp_path / "i.h5", ConvertOptions(to="hdf5"))
    path = tmp_path / "i.h5"
    ds = HDF5Dataset(path)  # a good file when the dataset is made...
    with h5py.File(path) as f:
        before = f["image/offsets"][()]
    number = int(before[4]) - 1 if value == "decrease" else value
    _corrupt_offsets(path, 5, number)  # ...changed before the loader runs
    where = "decrease at record 4" if value == "decrease" else f"gives {number} for record 5, outside the data"
    loader = DataLoader(ds, batch_size=2, num_workers=workers, multiprocessing_context="fork" if workers else None)
    batches = iter(loader)
    with pytest.raises(ConvertError, match=f"{path}: image/offsets {where}"):
        list(batches)
    to_the_end(batches, ConvertError)
    with pytest.raises(ConvertError, match=f"{path}: image/offsets {where}"):
        HDF5Dataset(path)
