"""Loading a task's examples: local files first (an air-gapped cluster), then the Hugging Face hub."""

from __future__ import annotations

import json
from pathlib import Path

from hlat.eval.tasks.base import Dataset, Doc

EXTENSIONS = ("jsonl", "json", "parquet", "arrow")


class DataMissing(FileNotFoundError):
    """A task's data is not available here; the message says where it was looked for."""


def load_split(data: Dataset, split: str, data_dir: Path | None) -> list[Doc]:
    if data.files or data.path:  # a task file's own data: --data-dir does not apply
        return _load_named(data, split)
    if data_dir is not None:
        docs = _load_local(Path(data_dir) / data.local, split, data.hub_configs)
        if docs is not None:
            return docs
    if data.bundled is not None:
        return data.bundled(split)
    if data.hub:
        return _load_hub(data, split, data_dir)
    raise DataMissing(
        f"no data for {data.local}/{split}: put {split}.jsonl under {(data_dir or Path('<data-dir>')) / data.local}"
    )


def read_file(file: Path) -> list[Doc]:
    if file.suffix == ".jsonl":
        with open(file, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]
    if file.suffix == ".json":
        rows = json.loads(file.read_text(encoding="utf-8"))
        if not isinstance(rows, list):
            raise ValueError(f"{file}: expected a JSON list of objects (or use .jsonl)")
        return rows
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as err:
        raise ImportError(f"reading {file} needs pyarrow: pip install pyarrow (or use .jsonl)") from err
    if file.suffix == ".parquet":
        return pq.read_table(file).to_pylist()
    with pa.memory_map(str(file)) as source:  # datasets writes the Arrow streaming format
        try:
            return pa.ipc.open_stream(source).read_all().to_pylist()
        except pa.ArrowInvalid:
            return pa.ipc.open_file(source).read_all().to_pylist()


def _find(folder: Path, split: str) -> Path | None:
    for ext in EXTENSIONS:
        if (folder / f"{split}.{ext}").is_file():
            return folder / f"{split}.{ext}"
    return None


def _load_named(data: Dataset, split: str) -> list[Doc]:
    if data.path:
        docs = _load_local(Path(data.path), split, ())
        if docs is None:
            raise DataMissing(f"no {split} split in {data.path}: put {split}.jsonl (or .json, .parquet, .arrow) there")
        return docs
    files = dict(data.files).get(split)
    if not files:
        raise DataMissing(f"no {split} split among dataset_kwargs.data_files ({', '.join(s for s, _ in data.files)})")
    missing = [f for f in files if not Path(f).is_file()]
    if missing:
        raise DataMissing(f"{split} split: {', '.join(missing)} not found")
    return [doc for f in files for doc in read_file(Path(f))]


def _load_local(folder: Path, split: str, configs: tuple[str, ...]) -> list[Doc] | None:
    file = _find(folder, split)
    if file is not None:
        return read_file(file)
    found = [(c, _find(folder / c, split)) for c in configs]
    if configs and any(f is not None for _, f in found):
        return [{**doc, "config": c} for c, f in found if f is not None for doc in read_file(f)]
    return None


def _load_hub(data: Dataset, split: str, data_dir: Path | None) -> list[Doc]:
    where = f" (nothing under {Path(data_dir) / data.local})" if data_dir else ""
    try:
        import datasets
    except ImportError as err:
        raise DataMissing(
            f"{data.local}/{split}: no local file{where} and the `datasets` package "
            "is not installed; pass --data-dir with the task files"
        ) from err
    try:
        if not data.hub_configs:
            return list(datasets.load_dataset(data.hub, data.hub_name, split=split))
        return [
            {**doc, "config": c} for c in data.hub_configs for doc in datasets.load_dataset(data.hub, c, split=split)
        ]
    except Exception as err:  # offline, gated or renamed: all mean "not available here"
        raise DataMissing(
            f"{data.local}/{split}: no local file{where} and the hub dataset "
            f"{data.hub} could not be loaded ({type(err).__name__}: {err})"
        ) from err
