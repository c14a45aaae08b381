"""loadprof.converters.tf: tf.data pipelines over our TFRecord shards and HDF5 files, in real TensorFlow."""

from __future__ import annotations

import numpy as np
import pytest

from loadprof.converters import ConvertError, ConvertOptions, SourceOptions, convert
from tests.convert_helpers import make_image_folder

pytestmark = pytest.mark.tensorflow
tf = pytest.importorskip("tensorflow")
from loadprof.converters.tf import hdf5_dataset, tfrecord_dataset  # noqa: E402

N = 23


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("tfreaders")
    rng = np.random.default_rng(2)
    arrays = {
        "id": np.arange(N, dtype=np.int64),
        "x": rng.standard_normal((N, 2, 3)).astype(np.float32),
        "pix": rng.integers(0, 256, (N, 4, 4), dtype=np.uint8),
        "w": rng.standard_normal(N),  # float64: stored raw, exact
        "small": (np.arange(N) % 3).astype(np.uint8),
    }
    np.savez(root / "d.npz", **arrays)
    convert(root / "d.npz", root / "tf", ConvertOptions(to="tfrecord", shard_size=400))
    convert(root / "d.npz", root / "d.h5", ConvertOptions(to="hdf5"))
    return root, arrays


def by_id(ds):
    rows = {}
    for item in ds.as_numpy_iterator():
        rows[int(item["id"])] = item
    return rows


def test_tfrecord_dataset_parses_every_field_with_its_dtype_and_shape(data):
    root, arrays = data
    ds = tfrecord_dataset(root / "tf")
    spec = ds.element_spec
    assert spec["x"].shape == (2, 3) and spec["x"].dtype == tf.float32
    assert spec["pix"].shape == (4, 4) and spec["pix"].dtype == tf.uint8
    assert spec["w"].dtype == tf.float64 and spec["small"].dtype == tf.uint8
    rows = by_id(ds)
    assert sorted(rows) == list(range(N))
    for i, row in rows.items():
        np.testing.assert_array_equal(row["x"], arrays["x"][i])
        np.testing.assert_array_equal(row["pix"], arrays["pix"][i])
        assert row["w"] == arrays["w"][i] and row["small"] == arrays["small"][i]


def test_hdf5_dataset_has_a_static_signature(data):
    root, arrays = data
    ds = hdf5_dataset(root / "d.h5")
    assert ds.element_spec["pix"] == tf.TensorSpec((4, 4), tf.uint8)
    rows = by_id(ds)
    assert sorted(rows) == list(range(N))
    np.testing.assert_array_equal(rows[7]["x"], arrays["x"][7])
    shuffled = [int(r["id"]) for r in hdf5_dataset(root / "d.h5", shuffle=True, seed=1).as_numpy_iterator()]
    assert sorted(shuffled) == list(range(N)) and shuffled != list(range(N))


def test_encoded_images_decode_in_tf(tmp_path):
    images = make_image_folder(tmp_path / "imgs", {"a": 2, "b": 1}, size=(5, 6))
    convert(tmp_path / "imgs", tmp_path / "tf", ConvertOptions(to="tfrecord"))
    convert(tmp_path / "imgs", tmp_path / "i.h5", ConvertOptions(to="hdf5"))
    for ds in (tfrecord_dataset(tmp_path / "tf", deterministic=True), hdf5_dataset(tmp_path / "i.h5")):
        got = [(tf.io.decode_png(item["image"]).numpy(), int(item["label"])) for item in ds]
        assert [label for _, label in got] == [0, 0, 1]
        for (pixels, _), (_, _, expected) in zip(got, images, strict=True):
            np.testing.assert_array_equal(pixels, expected)


def test_decoded_images_from_tfrecord(tmp_path):
    images = make_image_folder(tmp_path / "imgs", {"a": 2}, size=(3, 3))
    convert(tmp_path / "imgs", tmp_path / "tf", ConvertOptions(to="tfrecord", source=SourceOptions(decode=True)))
    got = list(tfrecord_dataset(tmp_path / "tf").as_numpy_iterator())
    np.testing.assert_array_equal(got[1]["image"], images[1][2])


def test_files_without_our_info_need_a_feature_spec(tmp_path):
    path = tmp_path / "plain.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as w:
        for i in range(3):
            ex = tf.train.Example(features=tf.train.Features(feature={
                "v": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))}))
            w.write(ex.SerializeToString())
    with pytest.raises(ConvertError, match="pass features="):
        tfrecord_dataset(path)
    ds = tfrecord_dataset(path, features={"v": tf.io.FixedLenFeature([], tf.int64)})
    assert [int(r["v"]) for r in ds] == [0, 1, 2]


def test_bad_input_is_a_convert_error_before_any_pipeline_runs(data, tmp_path):
    import json
    import shutil

    import h5py

    root, _ = data
    shutil.copy(root / "d.h5", tmp_path / "d.h5")
    with h5py.File(tmp_path / "d.h5", "r+") as f:
        f.attrs["num_records"] = 2**62
    with pytest.raises(ConvertError, match=f"{tmp_path / 'd.h5'}: attribute 'num_records' says {2**62} records"):
        hdf5_dataset(tmp_path / "d.h5")
    shutil.copytree(root / "tf", tmp_path / "tf")
    info = tmp_path / "tf" / "train.info.json"
    info.write_text(json.dumps({**json.loads(info.read_text()), "schema": "abc"}))
    with pytest.raises(ConvertError, match=f"{info}: 'schema': the schema is a string"):
        tfrecord_dataset(tmp_path / "tf")
