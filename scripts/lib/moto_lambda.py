"""The local moto server's IAM and Lambda, for sam-check.sh's deploy phase.

    moto_lambda.py role NAME    make a role Lambda may assume; prints its ARN
    moto_lambda.py check NAME   the function NAME as `cargo lambda deploy`
                                must leave it; then deletes it and its role

AWS_ENDPOINT_URL points the SDK at moto.
"""

import json
import sys

import boto3

TRUST = {
    "Version": "2012-10-17",
    "Statement": [
        {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}
    ],
}
# What the README's command asks for, and what a Reeve function needs to run.
EXPECTED = {
    "Handler": "bootstrap",
    "Runtime": "provided.al2023",
    "Architectures": ["x86_64"],
    "Environment": {"Variables": {"REEVE_CATALOG": "/var/task/reeve.toml"}},
}


def role(name: str) -> None:
    iam = boto3.client("iam")
    made = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(TRUST))
    print(made["Role"]["Arn"])


def check(name: str) -> None:
    lam = boto3.client("lambda")
    try:
        config = lam.get_function(FunctionName=name)["Configuration"]
        got = {key: config.get(key) for key in EXPECTED}
        wrong = {key: (got[key], want) for key, want in EXPECTED.items() if got[key] != want}
        if wrong or not config.get("CodeSize"):
            sys.exit(f"{name} is not as deployed: {wrong or 'no code'}")
        print(f"{name}: {json.dumps(got)}, {config['CodeSize']} bytes of code", file=sys.stderr)
    finally:
        lam.delete_function(FunctionName=name)
        boto3.client("iam").delete_role(RoleName=name)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("role", "check"):
        sys.exit(__doc__)
    {"role": role, "check": check}[sys.argv[1]](sys.argv[2])
