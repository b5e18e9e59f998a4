"""``tests/unit`` mirrors the package's rooms: one folder per room, whole-project checks apart.

A test file sits in the folder of the room whose code it tests (:data:`ROOMS` in
test_layout.py), in ``project`` when it checks the whole project, or in ``experiments`` when it
tests ``experiments/``; never directly in ``tests/unit``. Each folder is a package, so two rooms
may hold files of the same name and helpers import as ``tests.unit.<folder>.<module>``.
"""

from __future__ import annotations

from pathlib import Path

from tests.unit.project.test_layout import ROOMS

UNIT = Path(__file__).resolve().parents[1]
FOLDERS = (*ROOMS, "project", "experiments")


def misplaced(unit: Path) -> list[str]:
    """What in ``unit`` breaks the layout, as paths relative to it with the reason."""
    out = [f"{p.name}: a test file directly in tests/unit (move it to its room's folder)"
           for p in sorted(unit.glob("test_*.py"))]
    for d in sorted(p for p in unit.iterdir() if p.is_dir() and p.name != "__pycache__"):
        if d.name not in FOLDERS:
            out.append(f"{d.name}/: not a room of interp, nor project or experiments")
        elif not (d / "__init__.py").is_file():
            out.append(f"{d.name}/: no __init__.py")
    return out


def test_every_unit_test_file_is_in_a_room_folder():
    assert misplaced(UNIT) == []
    assert {p.parent.name for p in UNIT.rglob("test_*.py")} <= set(FOLDERS)


def test_the_check_catches_a_loose_file_an_unknown_folder_and_a_missing_package_marker(tmp_path):
    (tmp_path / "test_loose.py").write_text("")
    (tmp_path / "misc").mkdir()
    (tmp_path / "core").mkdir()
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages" / "__init__.py").write_text("")
    assert misplaced(tmp_path) == [
        "test_loose.py: a test file directly in tests/unit (move it to its room's folder)",
        "core/: no __init__.py",
        "misc/: not a room of interp, nor project or experiments",
    ]
