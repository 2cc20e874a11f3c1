"""A webhook receiver's check, with the official Python Standard Webhooks
package (`standardwebhooks`, pinned in scripts/requirements.txt) and nothing
of Reeve's: shared/tests/suite/webhooks.rs hands it the deliveries a test
receiver got and the secrets to try, and it prints, for each delivery, which
secrets verify it. Every expectation is the Rust test's.

stdin:  {"secrets": ["whsec_…", …], "deliveries": [{"headers": {…}, "body": "…"}, …]}
stdout: [[true, false], …]   one row per delivery, one column per secret
"""

import json
import sys

from standardwebhooks import Webhook, WebhookVerificationError


def verifies(secret: str, delivery: dict) -> bool:
    try:
        Webhook(secret).verify(delivery["body"], delivery["headers"])
        return True
    except WebhookVerificationError:
        return False


def main() -> None:
    given = json.load(sys.stdin)
    rows = [[verifies(secret, d) for secret in given["secrets"]] for d in given["deliveries"]]
    json.dump(rows, sys.stdout)


if __name__ == "__main__":
    main()
