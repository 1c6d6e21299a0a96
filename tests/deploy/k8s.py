"""Render the nicmon Helm chart and validate Kubernetes objects, offline.

Runs in the tool environment `cargo xtask deploy-tools` provisions (.tools/deploy-venv):
helm-python-sdk (Helm's Go engine as a library) and kubernetes-validate (the Kubernetes
API's JSON schemas, shipped in the package). Used by tests/tests/deploy.rs and by
`cargo xtask generate`.

  k8s.py render CHART NAME NAMESPACE [VALUES.yaml|key=value ...] -> JSON list of objects on stdout
  k8s.py yaml CHART NAME NAMESPACE [VALUES.yaml|key=value ...]   -> one YAML stream (plain manifests)
  k8s.py values CHART                                   -> the chart's default values as JSON
  k8s.py load FILE.yaml                                  -> JSON list of objects on stdout
  k8s.py validate VERSION FILE.json                      -> one line per object; exit 1 on any error
  k8s.py lint CHART [VALUES.yaml ...]                     -> Helm's lint findings; exit 1 on errors
"""

import json
import sys

import yaml


def fail(msg):
    print(msg, file=sys.stderr)
    sys.exit(2)


def merged_values(sources):
    """Values files and `key=value` sets (as helm's -f and --set), merged in order."""
    import helm_python as helm

    values = {}
    for s in sources:
        if "=" in s and not s.endswith((".yaml", ".yml")):
            values = deep_merge(values, helm.parse_set_string(s))
            continue
        with open(s) as fh:
            values = deep_merge(values, helm.values_from_yaml(fh.read()) or {})
    return values


def deep_merge(base, over):
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


# Helm's install order (pkg/release/util/kind_sorter.go), for the kinds this chart has and
# their neighbours: a plain `kubectl apply -f` of the manifests creates the Namespace and the
# ServiceAccount before the objects that live in or use them.
INSTALL_ORDER = [
    "PriorityClass", "Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange",
    "PodSecurityPolicy", "PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList",
    "ConfigMap", "StorageClass", "PersistentVolume", "PersistentVolumeClaim",
    "CustomResourceDefinition", "ClusterRole", "ClusterRoleList", "ClusterRoleBinding",
    "ClusterRoleBindingList", "Role", "RoleList", "RoleBinding", "RoleBindingList", "Service",
    "DaemonSet", "Pod", "ReplicationController", "ReplicaSet", "Deployment",
    "HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob", "IngressClass", "Ingress",
    "APIService",
]


def install_rank(text):
    kinds = [d.get("kind") for d in yaml.safe_load_all(text) if d]
    ranks = [INSTALL_ORDER.index(k) if k in INSTALL_ORDER else len(INSTALL_ORDER) for k in kinds]
    return min(ranks) if ranks else len(INSTALL_ORDER)


def render(chart, name, namespace, value_files):
    """The chart's rendered templates as (template, YAML text), in Helm's install order
    (by kind, then template name)."""
    import helm_python as helm

    with helm.Chart.load(chart) as c:
        out = c.render(merged_values(value_files), name=name, namespace=namespace)
    docs = [(k, v) for k, v in out.items() if k.endswith(".yaml") and v.strip()]
    return sorted(docs, key=lambda kv: (install_rank(kv[1]), kv[0]))


def objects_of(text, where):
    try:
        return [d for d in yaml.safe_load_all(text) if d]
    except yaml.YAMLError as e:
        fail(f"{where}: not valid YAML: {e}")


def main(argv):
    if len(argv) < 2:
        fail(__doc__)
    cmd, args = argv[1], argv[2:]
    if cmd in ("render", "yaml") and len(args) >= 3:
        chart, name, ns, files = args[0], args[1], args[2], args[3:]
        docs = render(chart, name, ns, files)
        if cmd == "render":
            objs = [o for tpl, text in docs for o in objects_of(text, tpl)]
            json.dump(objs, sys.stdout)
        else:
            for tpl, text in docs:
                objects_of(text, tpl)  # each template must parse on its own
                body = "\n".join(line.rstrip() for line in text.strip().splitlines())
                sys.stdout.write("---\n# Source: " + tpl + "\n" + body + "\n")
    elif cmd == "values" and len(args) == 1:
        import helm_python as helm

        with helm.Chart.load(args[0]) as c:
            json.dump(c.values, sys.stdout)
    elif cmd == "load" and len(args) == 1:
        with open(args[0]) as fh:
            json.dump(objects_of(fh.read(), args[0]), sys.stdout)
    elif cmd == "validate" and len(args) == 2:
        import kubernetes_validate as kv

        with open(args[1]) as fh:
            objs = json.load(fh)
        errors = 0
        for o in objs:
            what = f"{o.get('kind')}/{o.get('metadata', {}).get('name')}"
            try:
                v = kv.validate(o, args[0], strict=True)
                print(f"ok {what} (Kubernetes {v}, strict)")
            except kv.ValidationError as e:
                path = ".".join(str(p) for p in e.path)
                print(f"INVALID {what}: {path}: {e.message}")
                errors += 1
            except (kv.SchemaNotFoundError, kv.InvalidSchemaError) as e:
                print(f"INVALID {what}: no schema: {e.message}")
                errors += 1
        sys.exit(1 if errors else 0)
    elif cmd == "lint" and len(args) >= 1:
        import helm_python as helm

        res = helm.lint(args[0], values=merged_values(args[1:]))
        for m in res.get("messages", []):
            print(f"{m.get('severity')} {m.get('path')}: {m.get('error')}")
        sys.exit(1 if res.get("errors") else 0)
    else:
        fail(__doc__)


if __name__ == "__main__":
    main(sys.argv)
