"""Each source kind read end to end into HDF5 and back; the read back parses the file in a child
process (NOTE [ Parsing HDF5 in a child process ]). Bad input refused: tests/unit/test_convert_sources.py."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest

from loadprof.converters import (
    ConvertError,
    ConvertOptions,
    HDF5Reader,
    SourceOptions,
    convert,
)
from loadprof.converters.sources import open_source
from tests.convert_helpers import leftovers, make_image_folder, write_idx


def to_h5(src, out, **source):
    return convert(src, out, ConvertOptions(to="hdf5", verify=True, source=SourceOptions(**source)))


def test_image_folder_encoded_keeps_bytes_classes_and_torchvision_order(tmp_path):
    images = make_image_folder(tmp_path / "imgs", {"b_dog": 2, "a_cat": 3, "c_owl": 1})
    (tmp_path / "imgs" / "notes.txt").write_text("not an image, not in a class")
    (tmp_path / "imgs" / "a_cat" / "readme.md").write_text("ignored: not an image extension")
    result = to_h5(tmp_path / "imgs", tmp_path / "out.h5")
    assert result.records == 6 and result.verified
    reader = HDF5Reader(tmp_path / "out.h5")
    assert reader.class_names == ["a_cat", "b_dog", "c_owl"]
    assert reader.schema.field("image").content == "image"
    for i, (path, label, _) in enumerate(images):
        assert reader[i]["image"] == path.read_bytes()
        assert int(reader[i]["label"]) == label


def test_image_folder_decoded_and_resized(tmp_path):
    from PIL import Image

    images = make_image_folder(tmp_path / "imgs", {"a": 2}, size=(6, 6))
    Image.fromarray(np.zeros((9, 4, 3), np.uint8)).save(tmp_path / "imgs" / "a" / "odd.png")
    with pytest.raises(ConvertError, match=r"odd\.png: decoded to shape \[9, 4, 3\] .*pass --resize H W"):
        to_h5(tmp_path / "imgs", tmp_path / "out.h5", decode=True)
    assert not (tmp_path / "out.h5").exists() and leftovers(tmp_path) == []
    to_h5(tmp_path / "imgs", tmp_path / "out.h5", decode=True, resize=(5, 7), mode="L")
    reader = HDF5Reader(tmp_path / "out.h5")
    assert reader.schema.field("image").shape == (5, 7)
    (tmp_path / "imgs" / "a" / "odd.png").unlink()
    to_h5(tmp_path / "imgs", tmp_path / "exact.h5", decode=True)
    np.testing.assert_array_equal(HDF5Reader(tmp_path / "exact.h5")[1]["image"], images[1][2])


def test_npy_and_npz(tmp_path):
    x = np.arange(24, dtype=np.float64).reshape(6, 2, 2)
    np.save(tmp_path / "x.npy", x)
    to_h5(tmp_path / "x.npy", tmp_path / "x.h5")
    np.testing.assert_array_equal(HDF5Reader(tmp_path / "x.h5")[5]["data"], x[5])
    y = np.array([1, 0, 1, 1, 0, 2], dtype=np.uint8)
    np.savez(tmp_path / "d.npz", x=x.astype(np.float32), y=y, x_test=np.zeros((2, 2)))
    with pytest.raises(ConvertError, match=r"differ in length .*'x_test': 2.*--keys"):
        open_source(tmp_path / "d.npz")
    to_h5(tmp_path / "d.npz", tmp_path / "d.h5", keys=("x", "y"))
    reader = HDF5Reader(tmp_path / "d.h5")
    assert [(f.name, f.dtype, f.shape) for f in reader.schema.fields] == [("x", "float32", (2, 2)), ("y", "uint8", ())]
    assert reader[3]["y"].dtype == np.uint8 and int(reader[3]["y"]) == 1


@pytest.mark.parametrize("compress", [False, True])
def test_idx_images_find_their_labels(tmp_path, compress):
    images = np.random.default_rng(0).integers(0, 256, (7, 4, 3), dtype=np.uint8)
    labels = np.arange(7, dtype=np.uint8)
    suffix = ".gz" if compress else ""
    write_idx(tmp_path / f"train-images-idx3-ubyte{suffix}", images, compress)
    write_idx(tmp_path / f"train-labels-idx1-ubyte{suffix}", labels, compress)
    to_h5(tmp_path / f"train-images-idx3-ubyte{suffix}", tmp_path / "m.h5")
    reader = HDF5Reader(tmp_path / "m.h5")
    np.testing.assert_array_equal(reader[6]["image"], images[6])
    assert int(reader[6]["label"]) == 6


def test_csv_numeric_features_and_named_classes(tmp_path):
    (tmp_path / "iris.csv").write_text(
        "sepal,petal,species\n5.1,1.4,setosa\n\n7.0,4.7,versicolor\n6.3,6.0,setosa\n"
    )
    to_h5(tmp_path / "iris.csv", tmp_path / "iris.h5", label_column="species")
    reader = HDF5Reader(tmp_path / "iris.h5")
    assert reader.class_names == ["setosa", "versicolor"]
    assert reader.provenance is not None and reader.provenance["columns"] == ["sepal", "petal"]
    np.testing.assert_allclose(reader[1]["features"], [7.0, 4.7])
    assert [int(reader[i]["label"]) for i in range(3)] == [0, 1, 0]


def test_csv_integer_labels_stay_integers(tmp_path):
    (tmp_path / "d.csv").write_text("a,label,b\n1,3,2\n4,-1,5\n")
    to_h5(tmp_path / "d.csv", tmp_path / "d.h5")
    reader = HDF5Reader(tmp_path / "d.h5")
    assert reader.class_names is None
    assert reader.schema.field("label").dtype == "int64" and int(reader[1]["label"]) == -1


def test_torch_dataset_by_module_attribute(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    (tmp_path / "my_data.py").write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import Dataset

        class Squares(Dataset):
            classes = ["even", "odd"]
            def __len__(self):
                return 5
            def __getitem__(self, i):
                return torch.full((2, 3), float(i * i)), i % 2

        class Ragged(Squares):
            def __getitem__(self, i):
                return torch.zeros(i + 1), 0

        squares = Squares()
    """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    to_h5("my_data:squares", tmp_path / "s.h5")
    reader = HDF5Reader(tmp_path / "s.h5")
    assert reader.class_names == ["even", "odd"]
    assert reader.schema.field("input").dtype == "float32"
    np.testing.assert_array_equal(reader[3]["input"], np.full((2, 3), 9.0, np.float32))
    assert int(reader[3]["label"]) == 1
    with pytest.raises(ConvertError, match=r"my_data:Ragged: index 1: field 'input' has shape \[2\], expected \[1\]"):
        to_h5("my_data:Ragged", tmp_path / "r.h5")
    with pytest.raises(ConvertError, match="my_data has no attribute 'nope'"):
        open_source("my_data:nope")
    with pytest.raises(ConvertError, match="cannot import no_such_module"):
        open_source("no_such_module:x")
    sys.modules.pop("my_data", None)


def test_pil_images_from_a_dataset_become_arrays(tmp_path, monkeypatch):
    (tmp_path / "pil_data.py").write_text(textwrap.dedent("""
        import numpy as np
        from PIL import Image
        class D:
            def __len__(self):
                return 3
            def __getitem__(self, i):
                return {"img": Image.fromarray(np.full((4, 5), i, np.uint8)), "raw": bytes([i]) * i}
        ds = D()
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    to_h5("pil_data:ds", tmp_path / "p.h5")
    reader = HDF5Reader(tmp_path / "p.h5")
    np.testing.assert_array_equal(reader[2]["img"], np.full((4, 5), 2, np.uint8))
    assert reader[2]["raw"] == b"\x02\x02" and reader[0]["raw"] == b""
    sys.modules.pop("pil_data", None)
