"""Where each imported row came from (its file's identity and its place in
the file), the ids of rows without an idempotency key, and the order a
tenant's rows keep when they are gathered by tenant."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any
from uuid import UUID

import uuid_utils

from rota.loader.rows import ETA_MICROS

# The columns the import adds to each row: where it came from, so that the
# same row of the same file always gets the same id (and loads once).
FILE, POSITION = "_rota_file", "_rota_position"
# Where a row lies, to put a tenant's rows back in file order after they are
# gathered by tenant: its file's path, and (text formats) its count within
# its split.
PATH, PLACE = "_rota_path", "_rota_place"
ORIGIN = (FILE, POSITION, PATH, PLACE)


def import_task_id(file_identity: str, position: str) -> UUID:
    """An unkeyed imported row's id: its file (path, size, modification
    time) and its place in it. Importing the file again, or retrying a failed
    import, names the same tasks, which PostgreSQL then holds once."""
    name = f"rota-import:{file_identity}:{position}"
    return UUID(bytes=uuid_utils.uuid5(uuid_utils.NAMESPACE_URL, name).bytes)


def file_identity(path: str, size: int, modified: Any) -> str:
    return hashlib.sha256(f"{path}\n{size}\n{modified}".encode()).hexdigest()[:32]


def unkeyed_ids(batch: Any, rows_in_split: dict[str, int]) -> list[bytes]:
    """Each row's id if it has no idempotency key: `import_task_id` of its
    file and its place there (Parquet: its row index; text: its split's
    start and its count within the split, counted here unless counted before
    the rows were gathered by tenant)."""
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    files = batch.column(FILE)
    positions = batch.column(POSITION)
    if PLACE in batch.schema.names:
        counted = batch.column(PLACE).cast(pa.string())
    elif pa.types.is_string(positions.type) or pa.types.is_large_string(positions.type):
        counted = pa.array(places(batch, rows_in_split)).cast(pa.string())
    else:
        counted = None
    if counted is None:
        positions = positions.cast(pa.string())
    else:
        positions = pc.binary_join_element_wise(positions, counted, "+")
    names = pc.binary_join_element_wise(pa.scalar("rota-import"), files, positions, ":")
    namespace = uuid_utils.NAMESPACE_URL
    uuid5 = uuid_utils.uuid5
    return [uuid5(namespace, name).bytes for name in names.to_pylist()]


def with_origin(frame: Any, fmt: str) -> Any:
    """The file's rows, each with its file's identity and its place in it
    (Parquet: its row index; text formats: its split's start, counted on);
    a timestamp `eta` as microseconds since the epoch (an instant, whatever
    the executors' time zone)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampNTZType, TimestampType

    identity = F.sha2(
        F.concat_ws(
            "\n",
            F.col("_metadata.file_path"),
            F.col("_metadata.file_size").cast("string"),
            F.unix_micros(F.col("_metadata.file_modification_time")).cast("string"),
        ),
        256,
    ).substr(1, 32)
    position = (
        F.col("_metadata.row_index")
        if fmt == "parquet"
        else F.col("_metadata.file_block_start").cast("string")
    )
    columns = [F.col(c) for c in frame.columns]
    kind = frame.schema["eta"].dataType if "eta" in frame.columns else None
    if isinstance(kind, TimestampType | TimestampNTZType):
        eta = F.col("eta")
        if isinstance(kind, TimestampNTZType):
            eta = eta.cast("timestamp")  # zone-less: read in the session's zone, UTC
        columns = [F.col(c) for c in frame.columns if c != "eta"]
        columns.append(F.unix_micros(eta).alias(ETA_MICROS))
    return frame.select(
        *columns,
        identity.alias(FILE),
        position.alias(POSITION),
        F.col("_metadata.file_path").alias(PATH),
    )


def by_tenant_order(frame: Any, fmt: str, parallelism: int) -> Any:
    """The rows gathered by tenant, each tenant's in file order: executors
    then load disjoint sets of tenants, whose loads never wait for each
    other's locks (a load locks its tenants' tags), and a tenant's tasks take
    their places in line in the order of the file, at the price of a shuffle
    and a sort. Text formats first count each row's place within its split,
    in read order (its id depends on it)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StructField, StructType

    if "tenant" not in frame.columns:
        return frame  # every row is refused: no order to keep
    order = [F.col(PATH), F.col(POSITION)]
    if fmt != "parquet":
        counted = StructType([*frame.schema.fields, StructField(PLACE, LongType())])
        frame = frame.mapInArrow(_counted_in_split, counted)
        order = [F.col(PATH), F.col(POSITION).cast("long"), F.col(PLACE)]
    read = frame.rdd.getNumPartitions()
    if read == 1:
        return frame  # one partition: in file order, and alone with its tenants
    return frame.repartition(max(read, parallelism), F.col("tenant")).sortWithinPartitions(*order)


def _counted_in_split(batches: Iterable[Any]) -> Iterator[Any]:
    """Each row of a text file with its place within its split (the split's
    rows are read in order, within one partition)."""
    import pyarrow as pa

    rows_in_split: dict[str, int] = {}
    for batch in batches:
        yield batch.append_column(PLACE, pa.array(places(batch, rows_in_split)))


def places(batch: Any, rows_in_split: dict[str, int]) -> Any:
    """Each row's count within its split (text formats), carried on from the
    partition's earlier batches in `rows_in_split`."""
    import numpy as np
    import pyarrow.compute as pc

    splits = pc.binary_join_element_wise(batch.column(FILE), batch.column(POSITION), "@")
    encoded = pc.dictionary_encode(splits)
    indices = encoded.indices.to_numpy(zero_copy_only=False)
    places = np.empty(len(indices), dtype=np.int64)
    for code, split in enumerate(encoded.dictionary.to_pylist()):
        mine = indices == code
        start = rows_in_split.get(split, -1) + 1
        places[mine] = np.arange(start, start + int(mine.sum()))
        rows_in_split[split] = start + int(mine.sum()) - 1
    return places
