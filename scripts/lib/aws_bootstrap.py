"""Create the local bucket and queues (idempotent). Used by scripts/stack.sh.

Reads its settings from the environment:
  S3_ENDPOINT, SQS_ENDPOINT, S3_ACCESS_KEY, S3_SECRET_KEY, BUCKET, QUEUE, DLQ,
  TIMEOUT (seconds to keep retrying while the servers settle).
Prints the main queue URL on stdout.
"""

import json
import os
import sys
import time

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

env = os.environ
deadline = time.monotonic() + float(env.get("TIMEOUT", "60"))
cfg = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2},
             connect_timeout=3, read_timeout=10)


def retry(what, fn):
    last = None
    while time.monotonic() < deadline:
        try:
            return fn()
        except (BotoCoreError, ClientError) as e:  # server still settling
            last = e
            time.sleep(0.5)
    sys.exit(f"aws_bootstrap: {what} failed: {last}")


s3 = boto3.client("s3", endpoint_url=env["S3_ENDPOINT"], region_name="us-east-1",
                  aws_access_key_id=env["S3_ACCESS_KEY"],
                  aws_secret_access_key=env["S3_SECRET_KEY"], config=cfg)
bucket = env["BUCKET"]


def ensure_bucket():
    try:
        s3.head_bucket(Bucket=bucket)
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket", "NotFound"):
            raise
        s3.create_bucket(Bucket=bucket)
    # Prove the store can take a write (volumes are allocated lazily), then clean up.
    key = ".reeve-stack-probe"
    s3.put_object(Bucket=bucket, Key=key, Body=b"ok")
    s3.delete_object(Bucket=bucket, Key=key)


retry(f"S3 bucket {bucket}", ensure_bucket)

sqs = boto3.client("sqs", endpoint_url=env["SQS_ENDPOINT"], region_name="us-east-1",
                   aws_access_key_id="local", aws_secret_access_key="local", config=cfg)


def ensure_queues():
    dlq_url = sqs.create_queue(QueueName=env["DLQ"])["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    attrs = {
        "VisibilityTimeout": "360",
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "5"}),
    }
    return sqs.create_queue(QueueName=env["QUEUE"], Attributes=attrs)["QueueUrl"]


print(retry("SQS queues", ensure_queues))
