"""Each source kind's bad input refused by name, before anything is written: the image that
does not decode, the missing classes, object arrays (never unpickled), IDX and CSV files.
Each kind read end to end: tests/integration/test_convert_sources.py."""

from __future__ import annotations

import numpy as np
import pytest

from loadprof.converters import ConvertError, ConvertOptions, SourceOptions, convert, read_idx
from loadprof.converters.sources import open_source
from tests.convert_helpers import leftovers, make_image_folder, write_idx


def to_h5(src, out, **source):
    return convert(src, out, ConvertOptions(to="hdf5", verify=True, source=SourceOptions(**source)))


def test_every_image_is_decoded_so_a_truncated_one_fails_by_name(tmp_path):
    images = make_image_folder(tmp_path / "imgs", {"a": 3}, size=(32, 32))
    path = images[1][0]
    path.write_bytes(path.read_bytes()[:200])  # header intact, pixel data cut
    with pytest.raises(ConvertError, match=r"a/001\.png: not a decodable image"):
        to_h5(tmp_path / "imgs", tmp_path / "out.h5")
    assert not (tmp_path / "out.h5").exists() and leftovers(tmp_path) == []


def test_image_folder_without_classes_or_images(tmp_path):
    (tmp_path / "flat").mkdir()
    make_image_folder(tmp_path / "x", {"a": 1})
    (tmp_path / "x" / "a" / "000.png").rename(tmp_path / "flat" / "000.png")
    with pytest.raises(ConvertError, match="no class subfolders"):
        open_source(tmp_path / "flat")
    (tmp_path / "flat" / "empty").mkdir()
    with pytest.raises(ConvertError, match="no images .* in class folder.s. empty"):
        open_source(tmp_path / "flat")


class Boom:
    """Unpickling this would run code: the converter must never do it."""

    def __reduce__(self):
        return (print, ("unpickled!",))


def test_object_arrays_are_refused_without_unpickling(tmp_path, capsys):
    arr = np.empty(2, dtype=object)
    arr[:] = [Boom(), Boom()]
    np.save(tmp_path / "evil.npy", arr, allow_pickle=True)
    with pytest.raises(ConvertError, match=r"evil.npy: holds Python objects \(dtype=object\); .* unpickling"):
        to_h5(tmp_path / "evil.npy", tmp_path / "out.h5")
    np.savez(tmp_path / "evil.npz", ok=np.arange(2), bad=arr)
    with pytest.raises(ConvertError, match=r"evil.npz: array 'bad': holds Python objects \(dtype=object\); .* unpickling"):
        to_h5(tmp_path / "evil.npz", tmp_path / "out.h5")
    assert "unpickled!" not in capsys.readouterr().out


def test_idx_big_endian_types_and_bad_files(tmp_path):
    values = np.array([[1.5, -2.0], [3.0, 1e6]], dtype=np.float32)
    write_idx(tmp_path / "v.idx", values)
    np.testing.assert_array_equal(read_idx(tmp_path / "v.idx"), values)
    data = (tmp_path / "v.idx").read_bytes()
    (tmp_path / "t.idx").write_bytes(data[:-3])
    with pytest.raises(ConvertError, match=r"t\.idx: IDX header promises 28 bytes for shape \[2, 2\], file holds 25"):
        read_idx(tmp_path / "t.idx")
    (tmp_path / "m.idx").write_bytes(b"PK\x03\x04" + data[4:])
    with pytest.raises(ConvertError, match="not an IDX file"):
        read_idx(tmp_path / "m.idx")
    write_idx(tmp_path / "a-images-idx3-ubyte", np.zeros((3, 2, 2), np.uint8))
    with pytest.raises(ConvertError, match="no labels file beside it .*a-labels-idx1-ubyte.*--labels"):
        open_source(tmp_path / "a-images-idx3-ubyte")
    write_idx(tmp_path / "few.idx", np.zeros(2, np.uint8))
    with pytest.raises(ConvertError, match="2 labels for 3 images"):
        open_source(tmp_path / "a-images-idx3-ubyte", SourceOptions(labels=str(tmp_path / "few.idx")))


def test_csv_bad_cells_name_line_and_column(tmp_path):
    (tmp_path / "d.csv").write_text("a,b,label\n1,2,0\n3,x7,1\n")
    with pytest.raises(ConvertError, match=r"d\.csv: line 3, column 'b': 'x7' is not a number"):
        open_source(tmp_path / "d.csv")
    (tmp_path / "r.csv").write_text("a,b,label\n1,2,0\n3,1\n")
    with pytest.raises(ConvertError, match=r"r\.csv: line 3: 2 cells, expected 3"):
        open_source(tmp_path / "r.csv")
    (tmp_path / "n.csv").write_text("a,b,target\n1,2,0\n")
    with pytest.raises(ConvertError, match=r"no 'label' column \(columns: a, b, target\).*--label-column"):
        open_source(tmp_path / "n.csv")


def test_unknown_and_missing_sources(tmp_path):
    with pytest.raises(ConvertError, match="nothing.npy: no such file or directory"):
        open_source(tmp_path / "nothing.npy")
    (tmp_path / "a.parquet").write_bytes(b"PAR1")
    with pytest.raises(ConvertError, match="cannot tell what this is"):
        open_source(tmp_path / "a.parquet")
    np.save(tmp_path / "x.npy", np.zeros(3))
    with pytest.raises(ConvertError, match="--decode does not apply to a NumPy file"):
        open_source(tmp_path / "x.npy", SourceOptions(decode=True))
