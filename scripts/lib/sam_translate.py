"""template.yaml as plain CloudFormation, translated offline.

    python sam_translate.py TEMPLATE OUT.json [--defaults-to SAM.json] [Name=Default ...]

What `sam deploy` has CloudFormation do with the SAM transform, done here
with aws-sam-translator (the library the SAM CLI itself uses) and no AWS
account: current cfn-lint checks SAM resources only against their schemas,
and only on the translated template does it apply AWS's deploy-time rules
(E3505: an SQS event source's queue visibility timeout must cover its
function's timeout).

Offline means two stand-ins, as cfn-lint's own SAM transform had before it
was dropped:
- the region is samconfig.toml's, not the caller's profile;
- the managed-policy map is the translator's bundled copy, not IAM's live
  list (`sam validate` asks IAM for it);
- local CodeUri / ContentUri paths become placeholder S3 locations, as
  `sam package` would upload them.

Each `Name=Default` argument replaces that parameter's Default, so a variant
(e.g. the function VPC) is linted with its conditions taken the other way;
`--defaults-to` also writes that SAM template (as JSON, before translation)
for checkov, which takes conditions by the parameters' defaults.
"""

import json
import sys

import boto3
from samtranslator.internal.managed_policies import get_bundled_managed_policy_map
from samtranslator.parser.parser import Parser
from samtranslator.translator.translator import Translator
from samtranslator.yaml_helper import yaml_parse

# samconfig.toml's region: the translator needs one for ARNs and partitions.
# A session with a region and no credentials makes no call.
REGION = "us-east-1"
PLACEHOLDER = "s3://reeve-sam-check/placeholder.zip"
# Where each SAM resource type keeps a local path that `sam package` uploads.
LOCAL_PATHS = {
    "AWS::Serverless::Function": "CodeUri",
    "AWS::Serverless::LayerVersion": "ContentUri",
}


def main(src: str, dst: str, variant_to: str | None, overrides: list[str]) -> None:
    with open(src) as f:
        template = yaml_parse(f.read())
    for override in overrides:
        name, _, value = override.partition("=")
        parameter = template.get("Parameters", {}).get(name)
        if parameter is None:
            sys.exit(f"sam_translate: no parameter {name}")
        parameter["Default"] = value
    if variant_to:
        with open(variant_to, "w") as f:
            json.dump(template, f, indent=1)
    globals_function = template.get("Globals", {}).get("Function", {})
    if isinstance(globals_function.get("CodeUri"), str):
        globals_function["CodeUri"] = PLACEHOLDER
    for resource in template.get("Resources", {}).values():
        key = LOCAL_PATHS.get(resource.get("Type"))
        props = resource.get("Properties", {})
        if key and isinstance(props.get(key), str):
            props[key] = PLACEHOLDER
    translator = Translator(
        managed_policy_map=None, sam_parser=Parser(), boto_session=boto3.session.Session(region_name=REGION)
    )
    translated = translator.translate(
        sam_template=template,
        parameter_values={},
        get_managed_policy_map=lambda: get_bundled_managed_policy_map("aws") or {},
    )
    with open(dst, "w") as f:
        json.dump(translated, f, indent=1)


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) < 2:
        sys.exit(__doc__)
    variant = None
    if len(args) >= 4 and args[2] == "--defaults-to":
        variant = args[3]
        del args[2:4]
    main(args[0], args[1], variant, args[2:])
