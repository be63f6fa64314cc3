"""The values that cross the disk, each read by one parse that checks every field it is used for: a
build's record (build-info.json) and manifest, a prebuilt wheel's record, the library's statement of
its own build, an enabled environment's writer. A bad field is one line naming the file, never a
value taken silently or a traceback later. No compiler needed: the builds here are files on disk."""

import json
import os

import pytest
import torch

from torchgen_patch.errors import InputError
from torchgen_patch.runtime import Artifact, artifact_at
from torchgen_patch.runtime.compile import key as keys
from torchgen_patch.runtime.compile import record as records
from torchgen_patch.vocabulary import Origin

KERNEL = {"op": "aten::_foreach_zero_", "schema": "_foreach_zero_(Tensor(a!)[] self) -> ()", "shard": 0}


def _build(tmp_path, record=None, manifest=None):
    """A build directory as the compile leaves one (a library that is not one: nothing here loads it)."""
    os.chmod(tmp_path, 0o755)
    d = tmp_path / "build"
    (d / "src").mkdir(parents=True, mode=0o755, exist_ok=True)
    (d / "lib.so").write_bytes(b"\x7fELF not really a library")
    rec = {"format": records.RECORD_FORMAT, "key": "k" * 64, "torch": torch.__version__, "library": "lib.so",
           "sha256": "0" * 64}
    (d / records.RECORD).write_text(json.dumps(rec if record is None else record(rec)))
    plan = {"generator": "torchgen-patch", "kernels": [dict(KERNEL)], "shards": 1}
    (d / "src" / "torchgen_patch_manifest.json").write_text(json.dumps(plan if manifest is None else manifest(plan)))
    return str(d / "lib.so")


def _refusal(path) -> str:
    with pytest.raises(InputError) as e:
        artifact_at(path)
    assert "\n" not in e.value.render()
    return e.value.render()


def _set(**fields):
    return lambda doc: {**doc, **fields}


def test_a_build_is_read_into_one_artifact(tmp_path):
    lib = _build(tmp_path)
    art = artifact_at(lib)
    assert art.origin is Origin.GIVEN and art.key == "k" * 64 and art.sha256 == "0" * 64
    assert art.kernels == ((KERNEL["op"], KERNEL["schema"]),) and art.ops == [KERNEL["op"]]
    assert art.manifest.to_json()["shards"] == 1  # the rest of the plan travels untouched (a wheel packs it)
    assert json.dumps(artifact_at(lib, Origin.CACHE).to_json()) == json.dumps(
        {"path": lib, "sha256": "0" * 64, "torch": torch.__version__, "origin": "cache"})


@pytest.mark.parametrize("field,value", [("key", 7), ("sha256", 7), ("torch", None), ("format", "3"),
                                         ("flags", "-O2")])
def test_a_record_field_of_another_type_is_refused_in_one_line(tmp_path, field, value):
    """A key that is no string was dropped (the loaded library then went unchecked against it), a digest
    that is no string failed later with a traceback; now each is the build's one line."""
    lib = _build(tmp_path, record=_set(**{field: value}))
    said = _refusal(lib)
    if field == "torch":  # as before: the record names no torch
        assert said == (f"{lib}: error: built for torch None, this is torch {torch.__version__} "
                        "(hint: rebuild with `torchgen-patch build`)")
    else:
        assert said.startswith(f"{lib}: error: not a complete torchgen-patch build (build-info.json: '{field}' is")


@pytest.mark.parametrize("damage,said", [
    (lambda doc: [doc], "not a complete torchgen-patch build (its record or manifest is no mapping)"),
    (_set(torch="0.0.1"), f"built for torch 0.0.1, this is torch {torch.__version__} "
                          "(hint: rebuild with `torchgen-patch build`)"),
])
def test_the_record_refusals_say_what_they_said(tmp_path, damage, said):
    lib = _build(tmp_path, record=damage)
    assert _refusal(lib) == f"{lib}: error: {said}"


@pytest.mark.parametrize("damage,said", [
    (lambda doc: {**doc, "kernels": [{"schema": "s"}]}, "its manifest lacks 'op'"),
    (lambda doc: [doc], "its record or manifest is no mapping"),
    (lambda doc: {k: v for k, v in doc.items() if k != "kernels"}, "its manifest lacks 'kernels'"),
    (lambda doc: {**doc, "kernels": [{**KERNEL, "op": 1}]}, "its manifest lacks a kernel's op as a string, not int"),
    (lambda doc: {**doc, "kernels": "x"}, "its manifest lacks a list of kernels, not str"),
])
def test_a_manifest_that_lists_no_kernels_whole_is_refused(tmp_path, damage, said):
    """A kernel without its op, as before; and what was taken silently (a manifest without kernels was a
    library of none, an op of another type a kernel named by a number) is refused as well."""
    lib = _build(tmp_path, manifest=damage)
    assert _refusal(lib) == f"{lib}: error: not a complete torchgen-patch build ({said})"


def test_a_build_without_its_parts_says_which(tmp_path):
    lib = _build(tmp_path)
    os.remove(os.path.join(os.path.dirname(lib), "src", "torchgen_patch_manifest.json"))
    assert _refusal(lib).endswith("(torchgen_patch_manifest.json is missing)")
    assert artifact_at(lib, manifest=False).kernels == ()  # the boxed library has none
    os.rename(os.path.join(os.path.dirname(lib), "src"), os.path.join(os.path.dirname(lib), "gone"))
    assert _refusal(lib).endswith("(src/ is missing)")
    os.remove(os.path.join(os.path.dirname(lib), records.RECORD))
    assert _refusal(lib).endswith("(build-info.json is missing)")


def test_the_build_record_is_written_from_its_type_and_reads_back_the_same(tmp_path):
    timings = records.Timings(12.5, 2, 0.25, 4, None, 2, (("a.cpp", records.UnitTime(10, 3.5)),
                                                          ("b.cpp", records.UnitTime(20, None))))
    rec = records.BuildRecord("lib.so", "0" * 64, "k" * 64, format=records.RECORD_FORMAT, torch="2.0",
                              flags=("-O2",), timings=timings)
    data = rec.to_json()
    assert sorted(data) == ["cpus", "flags", "format", "jobs", "key", "library", "link_seconds", "load", "seconds",
                            "sha256", "torch", "unit_times", "units"]
    assert data["unit_times"] == {"a.cpp": {"bytes": 10, "seconds": 3.5}, "b.cpp": {"bytes": 20, "seconds": None}}
    back = records.BuildRecord.parse(json.loads(json.dumps(data)), "lib.so")
    # a unit ninja gave no time for says nothing to the estimate: left out when read
    assert back == records.BuildRecord("lib.so", "0" * 64, "k" * 64, format=3, torch="2.0", flags=("-O2",),
                                       timings=records.Timings(12.5, 2, 0.25, 4, None, 2, timings.unit_times[:1]))
    assert back.finished("k" * 64) and not back.finished("j" * 64)


def test_a_finished_build_is_one_whose_record_parses(tmp_path):
    """``complete`` reads the record through its parse: one of another shape is a damaged build (rebuilt)."""
    from torchgen_patch.fs.dirs import open_dir
    from torchgen_patch.fs.protected import cache_refusal

    lib = _build(tmp_path)
    builds = str(tmp_path)
    with open_dir(builds, cache_refusal(builds)) as d:
        assert records.complete(d, "build", "k" * 64)
    _build(tmp_path, record=_set(sha256=["0" * 64]))
    with open_dir(builds, cache_refusal(builds)) as d:
        assert not records.complete(d, "build", "k" * 64), lib


# ---- the library's statement of its own build ------------------------------------------------------

def _stated(**change) -> str:
    here = keys.TorchIdentity.here()
    said = {"stated": {"key": "k" * 64, "torch": here.to_json()},
            "headers": {"version": str(here.version).split("+")[0], "cxx11_abi": here.cxx11_abi}}
    for k, v in change.items():
        said[k] = v
    return json.dumps(said)


def test_the_stated_build_is_parsed_once_and_compared_field_by_field():
    assert keys.build_problem(_stated(), "k" * 64, "/l.so") is None
    other = {**keys.TorchIdentity.here().to_json(), "version": "2.14.1"}
    assert keys.build_problem(_stated(stated={"key": "k" * 64, "torch": other}), None, "/l.so") == (
        f"/l.so was built against another torch: version '2.14.1' (this torch: {torch.__version__!r})")
    assert keys.build_problem(_stated(), "j" * 64, "/l.so").startswith("the library loaded for /l.so is the build kkk")


@pytest.mark.parametrize("stated", [
    _stated(stated=[]),  # was an AttributeError out of the check: a traceback
    _stated(stated={"key": 7, "torch": {}}),
    _stated(headers={"version": 2, "cxx11_abi": None}),
    _stated(stated={"key": "k", "torch": {"version": 2}}),
    "not json",
])
def test_a_statement_in_another_form_is_said_as_that(stated):
    assert keys.build_problem(stated, None, "/l.so") == \
        "/l.so states its build in a form this torchgen-patch does not read"


def test_the_torch_identity_has_one_json_form():
    here = keys.TorchIdentity.here()
    assert keys.TorchIdentity.parse(here.to_json(), "x") == here and keys.torch_identity() == here.to_json()
    assert keys.TorchIdentity.parse({}, "x").differences(here)[0] == f"version None (this torch: {here.version!r})"
    with pytest.raises(InputError, match="its torch build is not one: cxx11_abi is str"):
        keys.TorchIdentity.parse({"cxx11_abi": "yes"}, "x")


# ---- a prebuilt wheel's record ----------------------------------------------------------------------

def _wheel_record(**change) -> dict:
    rec = {"format": 2, "torchgen_patch": "1.0", "torch": keys.torch_identity(), "library": "k.so",
           "sha256": "0" * 64, "key": "k" * 64, "overlay_sha256": None,
           "plan": {"kernels": [dict(KERNEL)], "shards": 1},
           "saved": {"library": "s.so", "sha256": "1" * 64, "key": None}}
    rec.update(change)
    return rec


def test_the_wheel_record_reads_back_what_it_wrote():
    from torchgen_patch.runtime.prebuilt import WheelRecord

    rec = WheelRecord.parse(json.dumps(_wheel_record()).encode(), "kernels 1.0")
    assert rec.to_json() == _wheel_record() and rec.plan.kernels == ((KERNEL["op"], KERNEL["schema"]),)
    assert rec.saved == records.LibraryRecord("s.so", "1" * 64, None)
    assert WheelRecord.parse(json.dumps(_wheel_record(saved=7)).encode(), "w").saved is None  # holds none


@pytest.mark.parametrize("rec,why", [
    ({k: v for k, v in _wheel_record().items() if k != "torch"}, "missing or damaged (KeyError: 'torch')"),
    (_wheel_record(format=1), "record format 1, this torchgen-patch reads 2"),
    # a format of another type said as its escaped repr: one line, never a second `error:` line of its own
    (_wheel_record(format="2\nerror: forged"), "record format '2\\nerror: forged', this torchgen-patch reads 2"),
    (_wheel_record(format=True), "record format True, this torchgen-patch reads 2"),
    (_wheel_record(format=[[0] * 100] * 100), "record format [[" + "0, " * 19 + "0...,"
                                              " this torchgen-patch reads 2"),
    (_wheel_record(sha256=None), "missing or damaged (TypeError: torch, library or sha256 of another type)"),
    (_wheel_record(plan={"kernels": [{"op": "x"}]}), "missing or damaged (KeyError: 'schema')"),
    # taken before: a key of another type (the library then stated none that was checked), a torch
    # build with a version that is a number (said as another torch, not as damage)
    (_wheel_record(key=7), "missing or damaged (TypeError: key, torchgen_patch or overlay_sha256 of another type)"),
    (_wheel_record(torch={**keys.torch_identity(), "version": 2}), "missing or damaged (TypeError: version is int)"),
])
def test_a_wheel_record_that_is_not_whole_says_why_in_one_line(tmp_path, rec, why):
    from torchgen_patch.fs.dirs import open_dir
    from torchgen_patch.fs.protected import library_refusal
    from torchgen_patch.runtime import prebuilt

    os.chmod(tmp_path, 0o755)
    (tmp_path / prebuilt.RECORD).write_text(json.dumps(rec))
    with open_dir(str(tmp_path), library_refusal(str(tmp_path))) as d:
        said = prebuilt._read_record(d, "kernels 1.0")
    assert said == f"kernels 1.0: its record.json is {why}" if why.startswith("missing") else \
        said == f"kernels 1.0: {why}", said


# ---- an enabled environment's writer; the artifact's origin ------------------------------------------

def test_the_writer_of_a_data_file_is_read_by_the_spec_module():
    from torchgen_patch.runtime.launch.spec import written_by

    assert written_by('{"enabled_by": {"torchgen_patch": "1.0", "hook": "/h.py"}}') == ("1.0", "/h.py")
    for text in ('{"enabled_by": {"torchgen_patch": 1, "hook": "/h.py"}}', "[]", '{"enabled_by": "x"}', "{"):
        with pytest.raises(ValueError):
            written_by(text)


def test_the_origin_is_a_word_whose_json_is_the_old_string():
    art = Artifact("/l.so", None, "2.0", records.NO_MANIFEST, Origin.PREBUILT, "/", prebuilt="1.0")
    assert json.dumps(art.to_json()["origin"]) == '"prebuilt"' and art.origin == Origin.PREBUILT
    assert [o.value for o in Origin] == ["prebuilt", "cache", "build", "given"]


def test_an_origin_named_by_its_word_is_that_origin(tmp_path):
    """``artifact_at(path, "cache")``, as the documented call read before the origin had a type of its own: the
    artifact holds ``Origin.CACHE``, and its JSON (what a launcher hands on) says "cache" (it raised
    AttributeError); a word that names no origin is refused where it is given."""
    lib = _build(tmp_path)
    art = artifact_at(lib, "cache")
    assert art.origin is Origin.CACHE and art.to_json()["origin"] == "cache"
    with pytest.raises(ValueError):
        artifact_at(lib, "cached")


@pytest.mark.parametrize("timing", [{"seconds": 10 ** 400}, {"cpus": 10 ** 400, "load": 1.0},
                                    {"unit_times": {"a.cpp": {"bytes": 10 ** 400, "seconds": 1.0}}},
                                    {"unit_times": {"a.cpp": {"bytes": 10, "seconds": 10 ** 400}}},
                                    {"seconds": float("nan"), "link_seconds": float("inf")}])
def test_timings_no_float_can_hold_are_left_out_not_a_traceback(tmp_path, timing):
    """A record's timings are read leniently: a number too large for a float, NaN or an infinity says nothing
    to the estimate and is absent, and the build is read (it raised OverflowError in every reader)."""
    from torchgen_patch.fs.dirs import open_dir
    from torchgen_patch.fs.protected import cache_refusal
    from torchgen_patch.runtime.compile import build_time

    lib = _build(tmp_path, record=lambda doc: {**doc, "unit_times": {}, "jobs": 2, **timing})
    assert artifact_at(lib).key == "k" * 64
    with open_dir(str(tmp_path), cache_refusal(str(tmp_path))) as d:
        assert records.complete(d, "build", "k" * 64)
        build_time.estimate(d, {"a.cpp": 10})  # says what it can, or nothing: never a traceback
    t = records.BuildRecord.parse(json.loads((tmp_path / "build" / records.RECORD).read_text()), lib).timings
    assert t is not None and t.jobs == 2 and t.unit_times == ()
    assert all(getattr(t, name) is None for name in ("seconds", "cpus", "link_seconds") if name in timing)
