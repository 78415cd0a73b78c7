"""``check_entry_point`` in real scripts: in the parent, and in spawn and forkserver children
importing the script again (no Prefect: the library's own guard)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_FIX = 'if __name__ == "__main__":'
_HEAD = f"""\
import multiprocessing, sys
sys.path.insert(0, {str(ROOT)!r})
from h5forge.main_guard import MainReimportError, check_entry_point


def entry():
    check_entry_point("build_dataset")
    print("ran", flush=True)
"""


def _run(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(_HEAD + body)
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )


@pytest.mark.parametrize(
    "body",
    [
        "entry()\n",  # straight from the module level
        "def main():\n    entry()\n\n\nmain()\n",  # through a function
        "try:\n    entry()\nfinally:\n    pass\n",  # in a block that is not the guard
        'if __name__ != "__main__":\n    pass\nelse:\n    entry()\n',  # the guard's else
    ],
    ids=["direct", "via-function", "in-try", "else-of-not-main"],
)
def test_an_unguarded_module_level_call_fails_in_the_parent(tmp_path: Path, body: str) -> None:
    run = _run(tmp_path, body)
    assert run.returncode == 1
    assert "ran" not in run.stdout
    error = run.stderr.strip().splitlines()
    assert any(
        line.startswith("h5forge.errors.MainReimportError: build_dataset() was called from")
        for line in error
    ), run.stderr
    assert _FIX in run.stderr
    assert "script.py (line " in run.stderr


@pytest.mark.parametrize(
    "body",
    [
        f"{_FIX}\n    entry()\n",
        "if '__main__' == __name__:\n    entry()\n",
        f"def main():\n    entry()\n\n\n{_FIX}\n    main()\n",
    ],
    ids=["guarded", "guard-reversed", "guarded-function"],
)
def test_a_guarded_call_runs(tmp_path: Path, body: str) -> None:
    run = _run(tmp_path, body)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "ran\n"


def test_python_c_is_not_a_script_children_import_again() -> None:
    code = _HEAD + "\nentry()\n"  # at the module level of a -c program: nothing re-runs it
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "ran\n"


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_child_importing_the_script_again_refuses(tmp_path: Path, method: str) -> None:
    # A call the parent cannot see (it runs only under the child's name for the script):
    # the child-side check, multiprocessing's own "still bootstrapping" flag, catches it.
    body = f"""\
if __name__ == "__mp_main__":
    try:
        entry()
    except MainReimportError as e:
        print("refused in the child:", e, flush=True)
{_FIX}
    p = multiprocessing.get_context({method!r}).Process(target=print, args=("child ran",))
    p.start()
    p.join()
"""
    run = _run(tmp_path, body)
    assert run.returncode == 0, run.stderr
    assert "refused in the child: build_dataset() was called while this process was" in (run.stdout)
    assert _FIX in run.stdout
    assert "child ran" in run.stdout


def test_a_pool_whose_workers_fail_on_the_script_says_why(tmp_path: Path) -> None:
    from h5forge.demo import write_image_folder

    files = write_image_folder(tmp_path / "src", classes=("a",), per_class=8, size=(16, 16))
    body = f"""\
from h5forge.preprocess.config import ImageConfig
from h5forge.preprocess.pool import iter_processed

multiprocessing.set_start_method("spawn")  # outside the guard: fails in every child


def main():
    print(len(list(iter_processed({[str(f) for f in files]!r}, ImageConfig(), workers=2))))


{_FIX}
    main()
"""
    run = _run(tmp_path, body)
    assert run.returncode == 1
    assert "RuntimeError: context has already been set" in run.stderr  # the child's own error
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("concurrent.futures.process.BrokenProcessPool: a worker process died")
    assert "failed when the spawn worker imported it again" in last
    assert "a set_start_method() call included" in last
