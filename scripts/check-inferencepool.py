"""Strict schema check of the InferencePool manifests in deploy/gateway-api.

Each InferencePool document is validated against the openAPIV3Schema of the
InferencePool CRD (scripts/schemas/, v1) with jsonschema, strictly: an object
schema that lists its properties accepts no other key (the API server's
strict field validation rejects unknown fields), unless it says
x-kubernetes-preserve-unknown-fields. `metadata` is checked for a name.
Prints one line per document; exits 1 on any failure.

Usage: python scripts/check-inferencepool.py CRD.yaml MANIFEST.yaml...
"""
import copy
import sys

import jsonschema
import yaml


def strict(schema):
    """The schema with additionalProperties false wherever properties are listed."""
    s = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (
                node.get("type") == "object"
                and "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(s)
    return s


def main(crd_path, manifests):
    crd = next(d for d in yaml.safe_load_all(open(crd_path)) if d)
    group = crd["spec"]["group"]
    kind = crd["spec"]["names"]["kind"]
    schemas = {
        f"{group}/{v['name']}": strict(v["schema"]["openAPIV3Schema"])
        for v in crd["spec"]["versions"]
        if v.get("served")
    }
    # metadata is the API server's ObjectMeta, not the CRD's to describe.
    for s in schemas.values():
        s.get("properties", {}).pop("metadata", None)
    failed = checked = 0
    for path in manifests:
        for doc in yaml.safe_load_all(open(path)):
            if not doc or doc.get("kind") != kind:
                continue
            checked += 1
            where = f"{path}: {kind} {doc.get('metadata', {}).get('name')}"
            schema = schemas.get(doc.get("apiVersion"))
            if schema is None:
                print(f"ERROR {where}: apiVersion {doc.get('apiVersion')} is not served by the CRD")
                failed += 1
                continue
            body = {k: v for k, v in doc.items() if k != "metadata"}
            errors = sorted(
                jsonschema.Draft7Validator(schema).iter_errors(body), key=lambda e: list(e.path)
            )
            if not doc.get("metadata", {}).get("name"):
                errors.append("metadata.name is missing")
            for e in errors:
                print(f"ERROR {where}: {getattr(e, 'message', e)} at {list(getattr(e, 'path', []))}")
            if errors:
                failed += 1
            else:
                print(f"INFO {where} passed (strict, {doc['apiVersion']})")
    if checked == 0:
        print(f"ERROR no {kind} found in {manifests}")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
