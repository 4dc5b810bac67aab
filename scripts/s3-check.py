#!/usr/bin/env python3
"""Checks that an S3-compatible server (moto, started by scripts/s3-server.sh)
honours the requests our Rust client makes: object_store with
S3ConditionalPut::ETagMatch creates with `If-None-Match: *` and updates with
`If-Match: <the ETag it read>` (quoted, as the server sent it), expecting 412
when the condition does not hold; reads use `Range` (bytes=a-b, a-, -n).

    eval "$(scripts/s3-server.sh start | sed 's/^/export /')"
    "$MASS_S3_PYTHON" scripts/s3-check.py            # or: s3-check.py http://127.0.0.1:PORT

Runs in a bucket of its own (s3-check-<pid>-<random>), deleted afterwards.
Prints one line per check (`ok` / `FAIL`) and `note` lines for behaviour
worth knowing that the client does not rely on; exits 1 if a check fails,
2 if the server cannot be reached.
"""
import os
import sys
import threading
import uuid

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

ENDPOINT = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("MASS_S3_ENDPOINT")
if not ENDPOINT:
    sys.exit("s3-check: no endpoint: pass it or set MASS_S3_ENDPOINT (scripts/s3-server.sh start)")

s3 = boto3.client(
    "s3",
    endpoint_url=ENDPOINT,
    region_name=os.environ.get("AWS_REGION", "us-east-1"),
    aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "testing"),
    aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"),
    # Path-style, like object_store's default; no retries, so each call is one request.
    config=Config(
        s3={"addressing_style": "path"},
        retries={"max_attempts": 1, "mode": "standard"},
        max_pool_connections=16,
    ),
)
BUCKET = f"s3-check-{os.getpid()}-{uuid.uuid4().hex[:8]}"
failures = []


def ok(what):
    print(f"ok    {what}")


def fail(what):
    print(f"FAIL  {what}")
    failures.append(what)


def note(what):
    print(f"note  {what}")


def status_of(call):
    """(HTTP status, S3 error code or None, response) of one call."""
    try:
        r = call()
        return r["ResponseMetadata"]["HTTPStatusCode"], None, r
    except ClientError as e:
        return e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"].get("Code"), e.response


def expect_412(what, call):
    status, code, _ = status_of(call)
    if status == 412:
        ok(f"{what}: 412 {code}")
    else:
        fail(f"{what}: expected 412 PreconditionFailed, got {status} {code}")


def body(key):
    return s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()


try:
    s3.create_bucket(Bucket=BUCKET)
except (BotoCoreError, ClientError) as e:
    print(f"s3-check: cannot create a bucket at {ENDPOINT}: {e}", file=sys.stderr)
    sys.exit(2)
print(f"s3-check: {ENDPOINT}, bucket {BUCKET}")

try:
    # --- create: If-None-Match: * -------------------------------------------------
    r = s3.put_object(Bucket=BUCKET, Key="k", Body=b"version-1", IfNoneMatch="*")
    etag1 = r["ETag"]
    raw = r["ResponseMetadata"]["HTTPHeaders"].get("etag", "")
    ok(f"PutObject If-None-Match: * on a new key: {r['ResponseMetadata']['HTTPStatusCode']}, ETag header {raw}")
    if raw.startswith('"') and raw.endswith('"'):
        ok("the ETag header is quoted (what object_store keeps and sends back in If-Match)")
    else:
        fail(f"the ETag header is not quoted: {raw!r}")
    expect_412(
        "PutObject If-None-Match: * on an existing key",
        lambda: s3.put_object(Bucket=BUCKET, Key="k", Body=b"other", IfNoneMatch="*"),
    )
    if body("k") == b"version-1":
        ok("the refused create left the object as it was")
    else:
        fail("the refused create changed the object")

    # --- update: If-Match: <etag> -------------------------------------------------
    status, code, r = status_of(lambda: s3.put_object(Bucket=BUCKET, Key="k", Body=b"version-2", IfMatch=etag1))
    if status == 200 and body("k") == b"version-2":
        etag2 = r["ETag"]
        ok(f"PutObject If-Match: <current ETag> {etag1}: 200, new ETag {etag2}")
    else:
        fail(f"PutObject If-Match: <current ETag>: expected 200 and the new body, got {status} {code}")
        etag2 = None
    expect_412(
        f"PutObject If-Match: <stale ETag> {etag1}",
        lambda: s3.put_object(Bucket=BUCKET, Key="k", Body=b"version-3", IfMatch=etag1),
    )
    if body("k") == b"version-2":
        ok("the refused update left the object as it was")
    else:
        fail("the refused update changed the object")

    # --- ranged reads (object_store GetRange::Bounded / Offset / Suffix) ----------
    s3.put_object(Bucket=BUCKET, Key="r", Body=b"0123456789")
    for rng, want, content_range in [
        ("bytes=2-5", b"2345", "bytes 2-5/10"),
        ("bytes=7-", b"789", "bytes 7-9/10"),
        ("bytes=-3", b"789", "bytes 7-9/10"),
    ]:
        r = s3.get_object(Bucket=BUCKET, Key="r", Range=rng)
        got = r["Body"].read()
        status = r["ResponseMetadata"]["HTTPStatusCode"]
        if status == 206 and got == want and r.get("ContentRange") == content_range:
            ok(f"GetObject Range: {rng}: 206, {got!r}, Content-Range: {content_range}")
        else:
            fail(f"GetObject Range: {rng}: expected 206 {want!r} {content_range}, got {status} {got!r} {r.get('ContentRange')}")

    # --- behaviour the client does not rely on -------------------------------------
    status, code, _ = status_of(lambda: s3.put_object(Bucket=BUCKET, Key="missing", Body=b"x", IfMatch=etag1))
    note(f"PutObject If-Match on a missing key: {status} {code}")
    if etag2:
        status, code, _ = status_of(
            lambda: s3.put_object(Bucket=BUCKET, Key="k", Body=b"version-3", IfMatch=etag2.strip('"'))
        )
        note(f"PutObject If-Match with the current ETag unquoted: {status} {code}")
        status, code, _ = status_of(lambda: s3.get_object(Bucket=BUCKET, Key="k", IfMatch=etag1))
        note(f"GetObject If-Match: <stale ETag>: {status} {code}")
        cur = s3.head_object(Bucket=BUCKET, Key="k")["ETag"]
        status, code, _ = status_of(lambda: s3.get_object(Bucket=BUCKET, Key="k", IfNoneMatch=cur))
        note(f"GetObject If-None-Match: <current ETag>: {status} {code}")
        status, code, _ = status_of(lambda: s3.get_object(Bucket=BUCKET, Key="k", IfMatch=cur.strip('"')))
        note(f"GetObject If-Match with the current ETag unquoted: {status} {code}")
        status, code, _ = status_of(lambda: s3.head_object(Bucket=BUCKET, Key="k", IfMatch=cur.strip('"')))
        note(f"HeadObject If-Match with the current ETag unquoted: {status} {code}")

    def multipart(key, **cond):
        up = s3.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
        part = s3.upload_part(Bucket=BUCKET, Key=key, UploadId=up, PartNumber=1, Body=b"multipart")
        parts = {"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]}
        return status_of(
            lambda: s3.complete_multipart_upload(Bucket=BUCKET, Key=key, UploadId=up, MultipartUpload=parts, **cond)
        )

    status, code, _ = multipart("k", IfNoneMatch="*")
    note(f"CompleteMultipartUpload If-None-Match: * on an existing key: {status} {code}")
    status, code, _ = multipart("mp-new", IfNoneMatch="*")
    note(f"CompleteMultipartUpload If-None-Match: * on a new key: {status} {code}")
    status, code, _ = multipart("k", IfMatch='"0000"')
    note(f"CompleteMultipartUpload If-Match: <wrong ETag>: {status} {code}")

    # Concurrent conditional writes of one key: on S3 exactly one wins. moto
    # checks the condition and then writes, without a lock, on a threaded
    # server: count the rounds with another number of winners. (Each writer
    # writes a different body: an update writing the body the object already
    # has keeps its ETag, and a second If-Match on that ETag rightly passes.)
    def race(kind, rounds=30, threads=8):
        odd = 0
        for i in range(rounds):
            key = f"race-{kind}-{i}"
            if kind == "update":
                cond = {"IfMatch": s3.put_object(Bucket=BUCKET, Key=key, Body=b"initial")["ETag"]}
            else:
                cond = {"IfNoneMatch": "*"}
            wins = []
            barrier = threading.Barrier(threads)

            def write(n):
                barrier.wait()
                status, _, _ = status_of(lambda: s3.put_object(Bucket=BUCKET, Key=key, Body=b"writer-%d" % n, **cond))
                if status == 200:
                    wins.append(n)

            ts = [threading.Thread(target=write, args=(n,)) for n in range(threads)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            odd += len(wins) != 1
        note(f"{threads} concurrent conditional {kind}s of one key, {rounds} rounds: "
             f"{rounds - odd} with exactly one winner, {odd} with another count")

    race("create")
    race("update")
finally:
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
            for o in page.get("Contents", []):
                s3.delete_object(Bucket=BUCKET, Key=o["Key"])
        for u in s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []):
            s3.abort_multipart_upload(Bucket=BUCKET, Key=u["Key"], UploadId=u["UploadId"])
        s3.delete_bucket(Bucket=BUCKET)
    except (BotoCoreError, ClientError) as e:
        print(f"s3-check: could not delete bucket {BUCKET}: {e}", file=sys.stderr)

if failures:
    print(f"s3-check: {len(failures)} check(s) failed: the server does not behave as the client expects", file=sys.stderr)
    sys.exit(1)
print("s3-check: all checks passed")
