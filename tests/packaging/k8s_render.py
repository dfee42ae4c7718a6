#!/usr/bin/env python3
"""Renders deploy/kubernetes/ as `kubectl kustomize` would, for the fields its kustomization.yaml
uses (resources, labels, images, replicas; any other field fails, so nothing is silently left
out), and checks what the schemas cannot: the probes' paths, selectors that match the pods'
labels, every secret and config map reference, resource requests.

  k8s_render.py DIR OUT     writes the rendered manifests to OUT (one YAML stream)
"""
import copy
import sys

import yaml

KNOWN = {"apiVersion", "kind", "labels", "resources", "images", "replicas"}


def fail(message):
    print(f"k8s_render: {message}", file=sys.stderr)
    sys.exit(1)


def render(directory):
    with open(f"{directory}/kustomization.yaml") as f:
        kustomization = yaml.safe_load(f)
    unknown = set(kustomization) - KNOWN
    if unknown:
        fail(f"kustomization.yaml uses fields this renderer does not apply: {sorted(unknown)}")
    docs = []
    for resource in kustomization["resources"]:
        with open(f"{directory}/{resource}") as f:
            docs.extend(d for d in yaml.safe_load_all(f) if d)
    for entry in kustomization.get("labels", []):
        if entry.get("includeSelectors") or entry.get("includeTemplates"):
            fail("labels with includeSelectors/includeTemplates are not rendered here")
        for doc in docs:
            doc.setdefault("metadata", {}).setdefault("labels", {}).update(entry["pairs"])
    for image in kustomization.get("images", []):
        for doc in docs:
            for c in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                name, _, _ = c["image"].partition(":")
                if name == image["name"]:
                    c["image"] = f"{image.get('newName', name)}:{image['newTag']}"
    for r in kustomization.get("replicas", []):
        targets = [d for d in docs if d["metadata"]["name"] == r["name"] and "replicas" in d.get("spec", {})]
        if not targets:
            fail(f"replicas: nothing named {r['name']}")
        for d in targets:
            d["spec"]["replicas"] = r["count"]
    return docs


def check(docs):
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    for kind in ("Deployment", "Service", "PodDisruptionBudget", "ConfigMap"):
        if kind not in by_kind:
            fail(f"no {kind}")
    deployment = by_kind["Deployment"][0]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    matches = lambda selector: all(pod_labels.get(k) == v for k, v in selector.items())
    if not matches(deployment["spec"]["selector"]["matchLabels"]):
        fail("the Deployment's selector does not match its pods")
    if not matches(by_kind["Service"][0]["spec"]["selector"]):
        fail("the Service's selector does not match the pods")
    if not matches(by_kind["PodDisruptionBudget"][0]["spec"]["selector"]["matchLabels"]):
        fail("the PodDisruptionBudget's selector does not match the pods")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    if container["readinessProbe"]["httpGet"]["path"] != "/ready":
        fail("readiness is not /ready")
    if container["livenessProbe"]["httpGet"]["path"] != "/health":
        fail("liveness is not /health")
    if not container["resources"]["requests"].get("cpu") or not container["resources"]["requests"].get("memory"):
        fail("no CPU and memory requests")
    config_maps = {c["metadata"]["name"] for c in by_kind["ConfigMap"]}
    for source in container.get("envFrom", []):
        if "configMapRef" in source and source["configMapRef"]["name"] not in config_maps:
            fail(f"envFrom names a ConfigMap that is not rendered: {source}")
    secrets = {e["valueFrom"]["secretKeyRef"]["key"] for e in container["env"]
               if "secretKeyRef" in e.get("valueFrom", {})}
    for key in ("JWT_SECRET", "DB_CONNECTION"):
        if key not in secrets:
            fail(f"{key} is not read from the Secret")
    if "NODE_ID" not in {e["name"] for e in container["env"]}:
        fail("NODE_ID is not set per pod")
    if deployment["spec"]["replicas"] < 2:
        fail("fewer than two nodes")


def main():
    docs = render(sys.argv[1])
    check(copy.deepcopy(docs))
    with open(sys.argv[2], "w") as f:
        yaml.safe_dump_all(docs, f, sort_keys=False)
    print(f"k8s_render: {len(docs)} resources: " + ", ".join(f"{d['kind']}/{d['metadata']['name']}" for d in docs))


if __name__ == "__main__":
    main()
