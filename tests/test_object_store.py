"""Object-store locations (warehouse.object_store) against a real S3 server on 127.0.0.1."""

from __future__ import annotations

import pytest

from warehouse.object_store import (
    ObjectStoreError,
    UnsupportedLocation,
    filesystem,
    is_url,
    local_path,
    one_line_error,
    require_supported,
)


def test_urls_and_local_paths_are_told_apart():
    assert is_url("s3://bucket/logs") and is_url("S3://bucket")
    assert not is_url("file:///tmp/logs") and not is_url("logs/s3:x") and not is_url("/tmp")
    assert str(local_path("file:///tmp/logs")) == "/tmp/logs"
    with pytest.raises(UnsupportedLocation, match="s3://bucket: an object-store URL"):
        local_path("s3://bucket")


def test_a_scheme_gradebook_does_not_handle_is_named_never_taken_for_a_path():
    with pytest.raises(UnsupportedLocation) as err:
        require_supported("gs://bucket/logs", "log_dir")
    assert str(err.value) == (
        "log_dir gs://bucket/logs: gradebook reads and writes s3://, file:// URLs and local "
        "paths, not gs://"
    )
    assert require_supported("s3://bucket/logs") == "s3://bucket/logs"


def test_the_filesystem_reaches_the_server_named_by_aws_endpoint_url(s3_bucket):
    fs = filesystem(s3_bucket)
    fs.pipe(f"{s3_bucket}/a/b.txt", b"hello")
    assert fs.cat(f"{s3_bucket}/a/b.txt") == b"hello"
    assert [p.rsplit("/", 1)[-1] for p in fs.ls(f"{s3_bucket}/a")] == ["b.txt"]


def test_a_store_that_does_not_answer_is_one_line_naming_the_endpoint(s3_env, monkeypatch):
    from s3_kit import free_port

    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    fs = filesystem("s3://nowhere-bucket")
    fs.retries = 1
    with pytest.raises(Exception) as err:
        fs.ls("s3://nowhere-bucket/x")
    line = one_line_error("s3://nowhere-bucket/x", err.value)
    assert line == (
        f"s3://nowhere-bucket/x: the object store does not answer (endpoint {endpoint}): "
        "check that it is up and that AWS_ENDPOINT_URL points at it"
    )


def test_missing_credentials_say_what_to_set_and_show_no_secret(s3_env, monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    with pytest.raises(ObjectStoreError) as err:
        filesystem("s3://some-bucket/x")
    assert str(err.value) == (
        "s3://some-bucket/x: no credentials for the object store: set AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE (and AWS_ENDPOINT_URL for a store other than AWS)"
    )
