"""Strict validation of Kubernetes objects, for the chart and inject tests.

Reads YAML streams (files, or standard input for `-`), takes each List's items, and checks every
object strictly (unknown fields are errors) for each Kubernetes version given with -k: built-in
kinds against kubernetes-validate's bundled schemas, Prometheus-operator and cert-manager kinds
against the JSON schemas of cloudcoil's models, made strict. An object of any other kind fails:
nothing passes unchecked. Prints one line per kind and count; exit 1 on the first failure.

Needs: pip install kubernetes-validate cloudcoil-models-prometheus-operator
cloudcoil-models-cert-manager jsonschema
"""

import argparse
import collections
import sys

import jsonschema
import kubernetes_validate
import yaml
from cloudcoil.models.cert_manager import v1 as cert_manager
from cloudcoil.models.prometheus_operator import v1 as prometheus_operator

CUSTOM = {
    ("monitoring.coreos.com/v1", "PodMonitor"): prometheus_operator.PodMonitor,
    ("monitoring.coreos.com/v1", "ServiceMonitor"): prometheus_operator.ServiceMonitor,
    ("monitoring.coreos.com/v1", "PrometheusRule"): prometheus_operator.PrometheusRule,
    ("cert-manager.io/v1", "Certificate"): cert_manager.Certificate,
    ("cert-manager.io/v1", "Issuer"): cert_manager.Issuer,
    ("cert-manager.io/v1", "ClusterIssuer"): cert_manager.ClusterIssuer,
}


def strict(schema):
    """The schema with every object that lists its properties closed to others."""
    if isinstance(schema, dict):
        if "properties" in schema and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
        for value in schema.values():
            strict(value)
    elif isinstance(schema, list):
        for value in schema:
            strict(value)
    return schema


def validators():
    made = {}
    for key, model in CUSTOM.items():
        schema = strict(model.model_json_schema(by_alias=True))
        made[key] = jsonschema.Draft202012Validator(schema)
    return made


def objects(paths):
    for path in paths:
        text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
        for document in yaml.safe_load_all(text):
            if document is None:
                continue
            if document.get("kind") == "List":
                yield from ((path, item) for item in document.get("items") or [])
            else:
                yield path, document


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", "--kubernetes-version", action="append", required=True)
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    custom = validators()
    counts = collections.Counter()
    for path, obj in objects(args.files):
        key = (obj.get("apiVersion"), obj.get("kind"))
        name = f"{path}: {key[1]} {obj.get('metadata', {}).get('name')!r}"
        if key in custom:
            errors = sorted(custom[key].iter_errors(obj), key=str)
            if errors:
                print(f"{name}: {errors[0].message} at {list(errors[0].absolute_path)}", file=sys.stderr)
                return 1
        else:
            for version in args.kubernetes_version:
                try:
                    kubernetes_validate.validate(obj, version, strict=True)
                except kubernetes_validate.ValidationError as e:
                    print(f"{name} (Kubernetes {version}): {e.message} at {list(e.path)}", file=sys.stderr)
                    return 1
                except kubernetes_validate.SchemaNotFoundError:
                    print(f"{name}: no schema for {key[0]} {key[1]} in Kubernetes {version}", file=sys.stderr)
                    return 1
        counts[key[1]] += 1
    if not counts:
        print("no objects", file=sys.stderr)
        return 1
    for kind, count in sorted(counts.items()):
        print(f"valid: {count} {kind}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
