"""The workspace store in a bucket (workspaces.store.BucketStore), against a real S3 server on
127.0.0.1 (moto's, tests/s3_kit.py): written once with a conditional PUT, read by digest with
its sha256 checked, its errors in one line; and a restore that finds its archive there."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import threading

import pytest
import zstandard

from warehouse.object_store import ObjectStoreError
from workspaces.store import (
    BucketStore,
    ObjectMissing,
    ObjectUnusable,
    WorkspaceStore,
    default_store,
    open_store,
    split_stores,
)

MiB = 1024 * 1024


def _archive(text: str = "workspace") -> tuple[bytes, str]:
    data = (text * 4000).encode()
    return data, hashlib.sha256(data).hexdigest()


def _objects(s3, url: str) -> dict[str, bytes]:
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    listed = s3.client().list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {
        o["Key"]: s3.client().get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listed
    }


def test_a_bucket_store_keeps_each_archive_once_at_its_address_and_hands_it_back(
    s3_bucket, s3_env
) -> None:
    root = f"{s3_bucket}/sweep/workspaces"
    store = open_store(root)
    assert isinstance(store, BucketStore) and store.location == root
    data, digest = _archive()
    size = store.put(data, digest)
    assert 0 < size < len(data)  # compressed
    assert store.put(data, digest) == size  # already there: not written again
    objects = _objects(s3_env, root)
    assert list(objects) == [f"sweep/workspaces/sha256/{digest[:2]}/{digest}.tar.zst"]
    assert len(next(iter(objects.values()))) == size
    assert store.has(digest) and not store.has("0" * 64)
    assert store.get(digest, 64 * MiB) == data
    # another process reading the record's URL: a store of its own, the same object
    assert open_store(root + "/").get(digest, 64 * MiB) == data


def test_a_writer_that_lost_the_race_for_a_digest_never_replaces_the_winners_object(
    s3_bucket, s3_env, monkeypatch
) -> None:
    """Writer B stores the digest between writer A's look (not there) and A's PUT: A's PUT is
    conditional, refused, and A reports B's object, which stays as B wrote it."""
    root = f"{s3_bucket}/ws"
    data, digest = _archive("raced")
    a, b = BucketStore(root), BucketStore(root)
    # B's object: the same content framed otherwise (with a checksum), so a replacement shows
    b_bytes = zstandard.ZstdCompressor(level=3, write_checksum=True).compress(data)
    assert b_bytes != zstandard.ZstdCompressor(level=3).compress(data)
    real_info = a.fs.info
    looks: list[str] = []

    def info(url: str, **kwargs):
        if looks:
            return real_info(url, **kwargs)
        looks.append(url)
        with pytest.raises(FileNotFoundError):  # A looks: no object yet
            real_info(url, **kwargs)
        b.fs.pipe_file(url, b_bytes, mode="create")  # B's PUT lands before A's
        raise FileNotFoundError(url)

    monkeypatch.setattr(a.fs, "info", info)
    assert a.put(data, digest) == len(b_bytes)
    assert list(_objects(s3_env, root).values()) == [b_bytes]
    assert a.get(digest, 64 * MiB) == data


def test_writers_of_one_digest_at_once_all_succeed_and_leave_one_object(s3_bucket, s3_env) -> None:
    root = f"{s3_bucket}/ws"
    data, digest = _archive("together")
    barrier = threading.Barrier(6)
    sizes: list[int] = []
    errors: list[BaseException] = []

    def write() -> None:
        store = BucketStore(root)  # one per writer, as on separate hosts
        barrier.wait()
        try:
            sizes.append(store.put(data, digest))
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == [] and len(sizes) == 6 and len(set(sizes)) == 1
    assert len(_objects(s3_env, root)) == 1
    assert BucketStore(root).get(digest, 64 * MiB) == data


def test_a_replaced_or_damaged_object_in_the_bucket_is_refused_never_handed_back(
    s3_bucket, s3_env
) -> None:
    root = f"{s3_bucket}/ws"
    store = BucketStore(root)
    data, digest = _archive()
    store.put(data, digest)
    bucket, _, key = store.url(digest).removeprefix("s3://").partition("/")
    client = s3_env.client()
    # replaced: valid zstd, other content
    client.put_object(Bucket=bucket, Key=key, Body=zstandard.ZstdCompressor().compress(b"other"))
    with pytest.raises(ObjectUnusable, match="does not match its digest"):
        store.get(digest, 64 * MiB)
    client.put_object(Bucket=bucket, Key=key, Body=b"not zstd at all")
    with pytest.raises(ObjectUnusable, match="not a zstd object"):
        store.get(digest, 64 * MiB)
    # truncated
    whole = zstandard.ZstdCompressor().compress(data)
    client.put_object(Bucket=bucket, Key=key, Body=whole[: len(whole) // 2])
    with pytest.raises(ObjectUnusable):
        store.get(digest, 64 * MiB)
    # a bomb: inflates past the cap
    client.put_object(
        Bucket=bucket, Key=key, Body=zstandard.ZstdCompressor().compress(b"\0" * 8 * MiB)
    )
    with pytest.raises(ObjectUnusable, match="inflates past its cap"):
        store.get(digest, 1 * MiB)
    with pytest.raises(ObjectUnusable, match="not a sha256"):
        store.get("../../etc/passwd", 64 * MiB)


def test_a_missing_object_or_bucket_is_named(s3_bucket, s3_env) -> None:
    with pytest.raises(ObjectMissing, match=f"not in the store {s3_bucket}/ws"):
        BucketStore(f"{s3_bucket}/ws").get("0" * 64, 64 * MiB)
    with pytest.raises((ObjectMissing, ObjectStoreError)):
        BucketStore("s3://no-such-bucket-gradebook/ws").get("0" * 64, 64 * MiB)


def test_missing_credentials_are_one_line_naming_what_to_set(s3_env, monkeypatch) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    data, digest = _archive()
    with pytest.raises(ObjectStoreError) as err:
        BucketStore("s3://some-bucket/ws").put(data, digest)
    text = str(err.value)
    assert "\n" not in text and "AWS_ACCESS_KEY_ID" in text and "AWS_PROFILE" in text
    assert text.startswith("s3://some-bucket/ws")


def test_stores_are_told_apart_by_location_and_listed_with_urls(tmp_path) -> None:
    assert isinstance(open_store(tmp_path / "ws"), WorkspaceStore)
    assert isinstance(open_store(f"file://{tmp_path}/ws"), WorkspaceStore)
    assert open_store(f"file://{tmp_path}/ws").location == str(tmp_path / "ws")
    with pytest.raises(ValueError, match="gs://"):
        open_store("gs://bucket/ws")
    assert default_store("s3://b/sweep/logs/") == "s3://b/sweep/logs/workspaces"
    assert default_store(tmp_path / "logs") == tmp_path / "logs" / "workspaces"
    sep = os.pathsep
    assert split_stores(f"/a/ws{sep}s3://b/ws{sep}{sep}file:///c/ws") == [
        "/a/ws",
        "s3://b/ws",
        "file:///c/ws",
    ]
    assert split_stores("") == []


def test_a_restore_reads_its_archive_from_the_bucket_its_record_or_the_environment_names(
    s3_bucket, s3_env, tmp_path, monkeypatch
) -> None:
    from workspaces.archive import canonical
    from workspaces.record import STORE_KEY
    from workspaces.restore import STORES_ENV, RestoreSettings, Sandboxes, ScoringFailure

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        body = b"print('hi')\n"
        info = tarfile.TarInfo("work/main.py")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    archive = canonical(buf.getvalue(), ["/work"])
    root = f"{s3_bucket}/ws"
    BucketStore(root).put(archive.data, archive.digest)

    def sandboxes(store: str) -> Sandboxes:
        record = {
            "store": store,
            "sandboxes": [
                {
                    "name": "default",
                    "status": "captured",
                    "paths": ["/work"],
                    "digest": archive.digest,
                }  # fmt: skip
            ],
        }
        state = json.dumps({"store": {STORE_KEY: record}})
        return Sandboxes(state, RestoreSettings.here())

    box = sandboxes(root)
    data, roots, _ = box._archive(box.record.sandboxes[0])  # noqa: SLF001
    assert data == archive.data and roots == ["/work"]

    # the record names a directory that is gone; the environment names the bucket
    monkeypatch.setenv(STORES_ENV, f"{tmp_path / 'elsewhere'}{os.pathsep}{root}")
    box = sandboxes(str(tmp_path / "gone"))
    assert box._archive(box.record.sandboxes[0])[0] == archive.data  # noqa: SLF001

    # in no store: named, with the bucket that could not be read and why
    monkeypatch.setenv(STORES_ENV, "s3://no-such-bucket-gradebook/ws")
    box = sandboxes(str(tmp_path / "gone"))
    with pytest.raises(ScoringFailure) as err:
        box._archive(box.record.sandboxes[0])  # noqa: SLF001
    assert err.value.reason == "workspace_missing"
    assert "s3://no-such-bucket-gradebook/ws" in err.value.explanation
    assert STORES_ENV in err.value.explanation and "\n" not in err.value.explanation
