//! The deployment (issue: Helm chart, manifests, container build, operator guide): the chart
//! rendered by Helm's own engine with its default and standalone values, every object and the
//! plain manifests validated against the Kubernetes API schemas (strict, offline), the mounts
//! and capabilities the agent needs, and the binary accepting the rendered flags and config.
//!
//! Needs .tools/deploy-venv (`cargo xtask deploy-tools`; `cargo xtask test` provisions it).
use std::path::PathBuf;
use std::process::Command;

use nicmon_tests::deploy::{self, CHART, GUIDE, MANIFESTS, capture, k8s};
use nicmon_tests::nicmon_bin;
use nicmon_tests::prometheus::{CHART_RULES, RULES};
use serde_json::{Value, json};

/// The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schemas.
const KUBE_VERSIONS: [&str; 2] = ["1.30", "1.37"];

fn python() -> PathBuf {
    let root = deploy::repo_root();
    let p = deploy::tools_python(&root);
    assert!(p.is_file(), "{} missing: run `cargo xtask deploy-tools` (`cargo xtask test` does it)", p.display());
    p
}

/// The chart rendered with `values` (files and key=value sets, as helm's -f and --set).
fn render(values: &[&str]) -> Vec<Value> {
    let mut args = vec!["render", CHART, "nicmon", "nvsentinel"];
    args.extend(values);
    let out = capture(&mut k8s(&python(), &args), "render").unwrap();
    serde_json::from_str::<Vec<Value>>(&out).unwrap()
}

fn load(file: &str) -> Vec<Value> {
    let out = capture(&mut k8s(&python(), &["load", file]), "load").unwrap();
    serde_json::from_str(&out).unwrap()
}

/// Validates every object (strict schemas); `Err` holds the validator's report.
fn validate(objects: &[Value], version: &str) -> Result<String, String> {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("objects.json");
    std::fs::write(&f, serde_json::to_vec(objects).unwrap()).unwrap();
    let out = k8s(&python(), &["validate", version, f.to_str().unwrap()]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    match out.status.code() {
        Some(0) => Ok(text),
        Some(1) => Err(text),
        _ => panic!("validator failed to run: {}", String::from_utf8_lossy(&out.stderr)),
    }
}

fn kinds(objects: &[Value]) -> Vec<&str> {
    objects.iter().map(|o| o["kind"].as_str().unwrap()).collect()
}

fn daemonset(objects: &[Value]) -> &Value {
    objects.iter().find(|o| o["kind"] == "DaemonSet").expect("a DaemonSet")
}

fn configmap(objects: &[Value]) -> &Value {
    objects.iter().find(|o| o["kind"] == "ConfigMap").expect("a ConfigMap")
}

fn args(ds: &Value) -> Vec<String> {
    ds["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

/// `--flag=value` from the container args.
fn flag(ds: &Value, name: &str) -> Option<String> {
    args(ds).iter().find_map(|a| a.strip_prefix(&format!("{name}=")).map(str::to_string))
}

const STANDALONE: &str = "deploy/helm/nicmon/values-standalone.yaml";
/// Upstream NVSentinel's nic-health-monitor DaemonSet shape (issue #20).
const NVSENTINEL: &str = "deploy/helm/nicmon/values-nvsentinel.yaml";

/// The renderings every check runs on: (what, objects).
fn renderings() -> Vec<(String, Vec<Value>)> {
    let mut all = vec![
        ("default values".to_string(), render(&[])),
        ("standalone values".into(), render(&[STANDALONE])),
        ("nvsentinel values".into(), render(&[NVSENTINEL])),
    ];
    for m in &MANIFESTS {
        all.push((format!("deploy/manifests/{}", m.file), load(&format!("deploy/manifests/{}", m.file))));
    }
    all
}

#[test]
fn chart_and_plain_manifests_validate_against_the_kubernetes_schemas() {
    let lint = k8s(&python(), &["lint", CHART]).output().unwrap();
    assert!(lint.status.success(), "helm lint: {}", String::from_utf8_lossy(&lint.stdout));
    for (what, objects) in renderings() {
        assert!(kinds(&objects).contains(&"DaemonSet") && kinds(&objects).contains(&"ConfigMap"), "{what}");
        for v in KUBE_VERSIONS {
            let report = validate(&objects, v).unwrap_or_else(|e| panic!("{what} against Kubernetes {v}:\n{e}"));
            assert_eq!(report.lines().filter(|l| l.starts_with("ok ")).count(), objects.len(), "{what}: {report}");
        }
    }
    // The privileged fallback and the optional parts render valid objects too.
    let extra = render(&[
        "securityContext.privileged=true",
        "platformConnector.token.enabled=true",
        "metrics.service.enabled=true",
        "createNamespace=true",
        "metrics.enabled=false",
    ]);
    assert_eq!(kinds(&extra), ["Namespace", "ServiceAccount", "ConfigMap", "DaemonSet"]);
    validate(&extra, "1.30").unwrap();
}

/// The validator is strict: a misspelt field or a wrong type fails it.
#[test]
fn validation_rejects_a_misspelt_field_and_a_wrong_type() {
    let mut objects = render(&[]);
    let i = objects.iter().position(|o| o["kind"] == "DaemonSet").unwrap();
    objects[i]["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = json!([]);
    let e = validate(&objects, "1.30").unwrap_err();
    assert!(e.contains("INVALID DaemonSet/nicmon") && e.contains("volumeMount"), "{e}");

    let mut objects = render(&[]);
    objects[i]["spec"]["template"]["spec"]["hostNetwork"] = json!("yes");
    assert!(validate(&objects, "1.30").unwrap_err().contains("hostNetwork"));
}

#[test]
fn plain_manifests_are_the_chart_rendered() {
    let root = deploy::repo_root();
    for m in &MANIFESTS {
        let want = deploy::render_manifest(&python(), m).unwrap();
        let have = std::fs::read_to_string(root.join("deploy/manifests").join(m.file)).unwrap_or_default();
        assert!(have == want, "deploy/manifests/{} is stale: run `cargo xtask generate`", m.file);
    }
}

#[test]
fn the_daemonset_has_the_mounts_capabilities_and_probes_the_agent_needs() {
    for (what, objects) in renderings() {
        let ds = daemonset(&objects);
        let pod = &ds["spec"]["template"]["spec"];
        let c = &pod["containers"][0];
        assert_eq!(pod["hostNetwork"], true, "{what}: rtnetlink and /proc/net/route need the host network");

        // Volumes: name -> (hostPath, type) and mounts: container path -> (volume, readOnly).
        let host: Vec<(String, String, String)> = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| {
                let h = v.get("hostPath")?;
                Some((
                    v["name"].as_str()?.to_string(),
                    h["path"].as_str()?.to_string(),
                    h["type"].as_str().unwrap_or("").to_string(),
                ))
            })
            .collect();
        let mounts: Vec<(String, String, bool)> = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["mountPath"].as_str().unwrap().to_string(),
                    m["name"].as_str().unwrap().to_string(),
                    m["readOnly"].as_bool().unwrap_or(false),
                )
            })
            .collect();
        let mounted = |host_path: &str| -> (String, bool, String) {
            let (name, _, ty) = host
                .iter()
                .find(|(_, p, _)| p == host_path)
                .unwrap_or_else(|| panic!("{what}: no hostPath {host_path}"));
            let (at, _, ro) =
                mounts.iter().find(|(_, n, _)| n == name).unwrap_or_else(|| panic!("{what}: {name} not mounted"));
            (at.clone(), *ro, ty.clone())
        };
        let (sys, ro, _) = mounted("/sys");
        assert!(ro, "{what}: /sys read-only");
        assert_eq!(flag(ds, "--sysfs").as_deref(), Some(sys.as_str()), "{what}: --sysfs is the host /sys mount");
        let (proc_, ro, _) = mounted("/proc");
        assert!(ro);
        assert_eq!(flag(ds, "--procfs").as_deref(), Some(proc_.as_str()), "{what}");
        // The kernel log is off by default (a non-privileged container cannot open /dev/kmsg):
        // no device mount, and the daemon is told so.
        assert!(!host.iter().any(|(_, p, _)| p == "/dev/kmsg"), "{what}: /dev/kmsg mounted while kernelLog is off");
        assert!(args(ds).contains(&"--no-kmsg".to_string()), "{what}");
        // No hostPath that blocks the pod's start on a kernel without BTF: the container's
        // own sysfs has /sys/kernel/btf where the kernel has it.
        assert!(!host.iter().any(|(_, p, _)| p.starts_with("/sys/kernel/btf")), "{what}: BTF hostPath");
        assert_eq!(mounted("/sys/kernel/tracing").0, "/sys/kernel/tracing", "{what}: tracefs where nicmon looks");

        // Every file the flags name lies on a mount; the state directory is a writable
        // DirectoryOrCreate hostPath, the metadata directory read-only.
        let under = |file: &str| -> &(String, String, bool) {
            mounts
                .iter()
                .filter(|(at, _, _)| file.starts_with(&format!("{at}/")))
                .max_by_key(|(at, _, _)| at.len())
                .unwrap_or_else(|| panic!("{what}: {file} is on no mount"))
        };
        let state = flag(ds, "--state-file").unwrap();
        let (at, name, ro) = under(&state);
        assert!(!*ro, "{what}: state dir writable");
        let (_, hp, ty) = host.iter().find(|(n, _, _)| n == name).expect("state is a hostPath");
        assert_eq!((hp.as_str(), ty.as_str()), (at.as_str(), "DirectoryOrCreate"), "{what}: state survives restarts");
        let (_, name, ro) = under(&flag(ds, "--metadata-path").unwrap());
        assert!(*ro && host.iter().any(|(n, _, _)| n == name), "{what}: metadata is a read-only hostPath");
        let config = flag(ds, "--config").unwrap();
        let (_, name, ro) = under(&config);
        assert!(*ro);
        let cm = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == name.as_str()).unwrap();
        assert_eq!(cm["configMap"]["name"], configmap(&objects)["metadata"]["name"], "{what}");
        assert!(config.ends_with("/config.toml") && configmap(&objects)["data"]["config.toml"].is_string());

        // The connector socket lies in the mounted host socket directory (gRPC mode only).
        match flag(ds, "--sink").as_deref() {
            Some("grpc") => {
                let sock = flag(ds, "--platform-connector-socket").unwrap();
                let path = sock.strip_prefix("unix://").expect("unix:// target");
                let (at, name, ro) = under(path);
                assert!(!*ro, "{what}: connecting to a socket needs a writable mount");
                assert!(host.iter().any(|(n, p, _)| n == name && p == at), "{what}: socket dir is a hostPath");
            }
            Some("stdout") => {
                assert!(flag(ds, "--platform-connector-socket").is_none(), "{what}");
                assert!(!host.iter().any(|(_, p, _)| p.contains("nvsentinel") && !p.contains("lib")), "{what}");
            }
            other => panic!("{what}: unexpected sink {other:?}"),
        }

        // Capabilities rather than privilege.
        let sc = &c["securityContext"];
        assert_eq!(sc["privileged"], false, "{what}");
        let caps: Vec<&str> =
            sc["capabilities"]["add"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
        for need in ["BPF", "PERFMON", "SYSLOG"] {
            assert!(caps.contains(&need), "{what}: capability {need} missing from {caps:?}");
        }
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));

        // NODE_NAME from the downward API; probes on the metrics port.
        let env = c["env"].as_array().unwrap();
        let node = env.iter().find(|e| e["name"] == "NODE_NAME").expect("NODE_NAME");
        assert_eq!(node["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
        let port = flag(ds, "--metrics-port").expect("metrics on");
        // The endpoint listens on the node's IP only, not on every host interface.
        assert_eq!(flag(ds, "--metrics-bind-address").as_deref(), Some("$(HOST_IP)"), "{what}");
        let host_ip = env.iter().find(|e| e["name"] == "HOST_IP").expect("HOST_IP");
        assert_eq!(host_ip["valueFrom"]["fieldRef"]["fieldPath"], "status.hostIP", "{what}");
        let named = c["ports"].as_array().unwrap().iter().find(|p| p["name"] == "metrics").unwrap();
        assert_eq!(named["containerPort"].to_string(), port);
        assert_eq!(c["livenessProbe"]["httpGet"], json!({"path": "/healthz", "port": "metrics"}), "{what}");
        assert_eq!(c["readinessProbe"]["httpGet"], json!({"path": "/metrics", "port": "metrics"}), "{what}");

        // Resources cover the measured footprint (27 MiB start-up peak, `cargo xtask bench`).
        // (The NVSentinel values keep upstream's own requests and limits.)
        let limit = if what.starts_with("nvsentinel") { "512Mi" } else { "64Mi" };
        assert_eq!(c["resources"]["limits"]["memory"], limit, "{what}");
        assert!(pod["nodeSelector"].is_object() && pod["tolerations"].is_array(), "{what}");
    }

    // The documented fallback.
    let p = render(&["securityContext.privileged=true"]);
    let sc = &daemonset(&p)["spec"]["template"]["spec"]["containers"][0]["securityContext"];
    assert_eq!(sc["privileged"], true);
    assert!(sc.get("allowPrivilegeEscalation").is_none(), "Kubernetes rejects privileged without escalation");
}

/// Helm values about the kernel log, the metrics address and the manifests' order.
#[test]
fn kernel_log_bind_address_and_order_decisions_render_as_documented() {
    // The kernel log needs privilege: enabled with it, the device is mounted and watched;
    // enabled without it, the chart refuses to render (the pod could never read it).
    let on = render(&["kernelLog.enabled=true", "securityContext.privileged=true"]);
    let ds = daemonset(&on);
    assert!(!args(ds).contains(&"--no-kmsg".to_string()));
    let vols = ds["spec"]["template"]["spec"]["volumes"].as_array().unwrap();
    let kmsg = vols.iter().find(|v| v["hostPath"]["path"] == "/dev/kmsg").expect("kmsg volume");
    assert_eq!(kmsg["hostPath"]["type"], "CharDevice");
    validate(&on, "1.30").unwrap();
    let refused =
        k8s(&python(), &["render", CHART, "nicmon", "nvsentinel", "kernelLog.enabled=true"]).output().unwrap();
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("kernelLog.enabled=true needs securityContext.privileged=true"), "{err}");

    // An explicit bind address replaces the node IP (and the HOST_IP variable goes away).
    for addr in ["127.0.0.1", "0.0.0.0"] {
        let objects = render(&[&format!("metrics.bindAddress={addr}")]);
        let ds = daemonset(&objects);
        assert_eq!(flag(ds, "--metrics-bind-address").as_deref(), Some(addr));
        let env = ds["spec"]["template"]["spec"]["containers"][0]["env"].as_array().unwrap();
        assert!(!env.iter().any(|e| e["name"] == "HOST_IP"));
        assert_eq!(check_config(&objects, &[]).0, 0, "{addr}");
    }

    // One `kubectl apply -f` works: every object comes after the objects it needs (Helm's
    // install order), in the chart's renderings and in the plain manifests.
    let rank =
        |k: &str| ["Namespace", "ServiceAccount", "ConfigMap", "Service", "DaemonSet"].iter().position(|x| *x == k);
    let mut all = renderings();
    all.push((
        "every optional object".into(),
        render(&["createNamespace=true", "metrics.service.enabled=true", "platformConnector.token.enabled=true"]),
    ));
    for (what, objects) in all {
        let ks = kinds(&objects);
        let ranks: Vec<usize> =
            ks.iter().map(|k| rank(k).unwrap_or_else(|| panic!("{what}: unexpected kind {k}"))).collect();
        assert!(ranks.windows(2).all(|w| w[0] <= w[1]), "{what}: apply order {ks:?}");
    }
    let standalone = load("deploy/manifests/nicmon-standalone.yaml");
    assert_eq!(kinds(&standalone)[..2], ["Namespace", "ServiceAccount"], "the namespace and account come first");
}

/// The NVSentinel values render upstream's DaemonSet shape: names, ConfigMap key, mounts
/// under /nvsentinel, nodeSelector, probes, state directory, globals, token audience and
/// `publishTo` — and the binary accepts the result with upstream's whole counter list.
#[test]
fn nvsentinel_values_render_upstreams_daemonset_shape() {
    let objects = render(&[NVSENTINEL]);
    let ds = daemonset(&objects);
    assert_eq!(ds["metadata"]["name"], "nic-health-monitor");
    assert_eq!(configmap(&objects)["metadata"]["name"], "nic-health-monitor");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"], json!({"nvsentinel.dgxc.nvidia.com/driver.installed": "true"}));
    let mounts: Vec<&str> = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    for at in ["/nvsentinel/sys", "/nvsentinel/proc", "/etc/nic-health-monitor", "/var/run/nic_health_monitor"] {
        assert!(mounts.contains(&at), "{at} not in {mounts:?}");
    }
    assert_eq!(flag(ds, "--state-file").as_deref(), Some("/var/run/nic_health_monitor/state.json"));
    assert_eq!(flag(ds, "--metadata-path").as_deref(), Some("/var/lib/nvsentinel/gpu_metadata.json"));
    // Upstream's chart values for the poll-stall watchdog.
    assert_eq!(flag(ds, "--poll-stall-deadline").as_deref(), Some("10s"));
    assert_eq!(flag(ds, "--poll-stall-store-only").as_deref(), Some("true"));
    let (code, out) = check_config(&objects, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("counter rules:     18"), "upstream's default list is the set: {out}");
    assert!(out.contains("sysfs root:        /nvsentinel/sys"), "{out}");

    // Upstream's globals win: metrics port, metadata file, image tag, pull secrets.
    let g = render(&[
        NVSENTINEL,
        "global.metricsPort=9300",
        "global.metadataPath=/var/lib/nvsentinel-meta/gpu.json",
        "global.image.tag=v9",
        "global.imagePullSecrets[0].name=regcred",
    ]);
    let ds = daemonset(&g);
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(flag(ds, "--metrics-port").as_deref(), Some("9300"));
    assert_eq!(c["ports"][0]["containerPort"], 9300);
    assert_eq!(flag(ds, "--metadata-path").as_deref(), Some("/var/lib/nvsentinel-meta/gpu.json"));
    let vols = ds["spec"]["template"]["spec"]["volumes"].as_array().unwrap();
    assert!(vols.iter().any(|v| v["hostPath"]["path"] == "/var/lib/nvsentinel-meta"), "{vols:?}");
    assert!(c["image"].as_str().unwrap().ends_with(":v9"));
    assert_eq!(ds["spec"]["template"]["spec"]["imagePullSecrets"], json!([{"name": "regcred"}]));
    validate(&g, "1.30").unwrap();

    // Connector auth from the global: a projected token with upstream's audience.
    let auth = render(&[NVSENTINEL, "global.platformConnectorAuth.enabled=true"]);
    let ds = daemonset(&auth);
    let vols = ds["spec"]["template"]["spec"]["volumes"].as_array().unwrap();
    let token = vols.iter().find(|v| v["name"] == "connector-token").expect("token volume");
    assert_eq!(
        token["projected"]["sources"][0]["serviceAccountToken"]["audience"],
        "platform-connector.nvsentinel.nvidia.com"
    );
    assert!(flag(ds, "--platform-connector-token-path").is_some());
    validate(&auth, "1.30").unwrap();

    // publishTo: deployment → HEALTH_PUBLISH_* with the deployment audience and the CA Secret.
    let direct = render(&[
        NVSENTINEL,
        "publishTo=deployment",
        "platformConnector.deployment.caSecret=pcd-ca",
        "global.platformConnectorDeployment.auth.audience=platform-connector-deployment.nvsentinel.nvidia.com",
    ]);
    let ds = daemonset(&direct);
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    let env = |name: &str| c["env"].as_array().unwrap().iter().find(|e| e["name"] == name).map(|e| e["value"].clone());
    assert_eq!(
        env("HEALTH_PUBLISH_TARGET"),
        Some(json!("platform-connector-deployment.nvsentinel.svc.cluster.local:50051"))
    );
    let token_path = env("HEALTH_PUBLISH_TOKEN_PATH").unwrap();
    let ca = env("HEALTH_PUBLISH_TLS_CA_FILE").unwrap();
    let vols = ds["spec"]["template"]["spec"]["volumes"].as_array().unwrap();
    let token = vols.iter().find(|v| v["name"] == "connector-token").expect("token volume");
    assert_eq!(
        token["projected"]["sources"][0]["serviceAccountToken"]["audience"],
        "platform-connector-deployment.nvsentinel.nvidia.com"
    );
    assert!(vols.iter().any(|v| v["secret"]["secretName"] == "pcd-ca"));
    let mounts = c["volumeMounts"].as_array().unwrap();
    for file in [token_path.as_str().unwrap(), ca.as_str().unwrap()] {
        assert!(mounts.iter().any(|m| file.starts_with(m["mountPath"].as_str().unwrap())), "{file} on no mount");
    }
    assert!(flag(ds, "--platform-connector-token-path").is_none(), "direct mode takes the token from the env");
    validate(&direct, "1.30").unwrap();
    let insecure = render(&[
        NVSENTINEL,
        "publishTo=deployment",
        "global.platformConnectorDeployment.tls.mode=insecureDevelopmentMode",
    ]);
    let c = &daemonset(&insecure)["spec"]["template"]["spec"]["containers"][0];
    assert!(
        c["env"].as_array().unwrap().iter().any(|e| e["name"] == "HEALTH_PUBLISH_INSECURE" && e["value"] == "true")
    );

    // Values the chart cannot honour are refused at render time, naming them.
    for (set, named) in
        [("publishTo=queue", "publishTo=queue"), ("publishTo=deployment", "platformConnector.deployment.caSecret")]
    {
        let out = k8s(&python(), &["render", CHART, "nicmon", "nvsentinel", NVSENTINEL, set]).output().unwrap();
        assert!(!out.status.success(), "{set}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(named),
            "{set}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Upstream's newer chart values: `global.seLinuxOptions` (the pod's securityContext),
/// `global.priorityClassName` / `nodeSelector` / `affinity` / `tolerations` winning over the
/// chart's own, `updateStrategy` from values (upstream's RollingUpdate at 5 %), and
/// `portStateHoldDown` rendered into config.toml, which the binary then parses.
#[test]
fn nvsentinel_globals_update_strategy_and_hold_down_render() {
    let pod = |objects: &[Value]| daemonset(objects)["spec"]["template"]["spec"].clone();
    // Upstream's defaults: no priority class, RollingUpdate with maxUnavailable 5 %, no
    // pod securityContext, the hold-down rendered off.
    let objects = render(&[NVSENTINEL]);
    let ds = daemonset(&objects);
    assert_eq!(
        ds["spec"]["updateStrategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "5%"}})
    );
    assert!(pod(&objects).get("priorityClassName").is_none(), "{:#}", pod(&objects));
    assert!(pod(&objects).get("securityContext").is_none());
    let config = configmap(&objects)["data"]["config.toml"].as_str().unwrap().to_string();
    assert!(config.ends_with("\n[stateCheck]\nportStateHoldDown = \"0s\"\n"), "{config}");
    // The chart's own defaults: its priority class and nodeSelector, no hold-down table.
    let own = render(&[]);
    assert_eq!(pod(&own)["priorityClassName"], "system-node-critical");
    assert_eq!(pod(&own)["nodeSelector"], json!({"nvidia.com/gpu.present": "true"}));
    assert!(!configmap(&own)["data"]["config.toml"].as_str().unwrap().contains("[stateCheck]"));

    // Each global, set: it wins over the value of the same name.
    let affinity = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}]}}});
    let key = "global.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0]";
    let affinity_set = format!("{key}.key=pool,{key}.operator=In,{key}.values[0]=gpu");
    let cases: [(&str, &str, Value); 5] = [
        (
            "global.seLinuxOptions.type=spc_t,global.seLinuxOptions.level=s0",
            "securityContext",
            json!({"seLinuxOptions": {"type": "spc_t", "level": "s0"}}),
        ),
        ("global.priorityClassName=nvsentinel-critical", "priorityClassName", json!("nvsentinel-critical")),
        ("global.nodeSelector.pool=gpu", "nodeSelector", json!({"pool": "gpu"})),
        (
            "global.tolerations[0].key=nvidia.com/gpu,global.tolerations[0].operator=Exists,global.tolerations[0].effect=NoSchedule",
            "tolerations",
            json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]),
        ),
        (&affinity_set, "affinity", affinity),
    ];
    for (set, field, want) in &cases {
        // Over both the chart's own values and the NVSentinel ones (which set the field or not).
        for base in [vec![], vec![NVSENTINEL]] {
            let mut values = base.clone();
            values.push(set);
            let objects = render(&values);
            assert_eq!(&pod(&objects)[field], want, "{set} over {base:?}");
            validate(&objects, "1.30").unwrap();
        }
    }
    // The chart's own value where no global is set; an empty global does not erase it.
    let own = render(&["priorityClassName=mine", "global.priorityClassName="]);
    assert_eq!(pod(&own)["priorityClassName"], "mine");

    // updateStrategy from values.
    let od = render(&[NVSENTINEL, "updateStrategy.type=OnDelete", "updateStrategy.rollingUpdate=null"]);
    assert_eq!(daemonset(&od)["spec"]["updateStrategy"], json!({"type": "OnDelete"}));
    validate(&od, "1.30").unwrap();

    // portStateHoldDown reaches the binary's parser: accepted, and a bad value is refused
    // naming the config key.
    let hd = render(&[NVSENTINEL, "portStateHoldDown=2s"]);
    assert!(
        configmap(&hd)["data"]["config.toml"].as_str().unwrap().contains("[stateCheck]\nportStateHoldDown = \"2s\"\n")
    );
    let (code, out) = check_config(&hd, &[]);
    assert_eq!(code, 0, "{out}");
    let bad = render(&[NVSENTINEL, "portStateHoldDown=soon"]);
    let (code, out) = check_config(&bad, &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("stateCheck.portStateHoldDown"), "{out}");
    // Set both in the value and in the config's own [stateCheck] table: refused at render.
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("own-state-check.yaml");
    std::fs::write(&values, "config: |\n  [stateCheck]\n  flapThreshold = 4\n").unwrap();
    let out = k8s(&python(), &["render", CHART, "nicmon", "nvsentinel", NVSENTINEL, values.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("portStateHoldDown is set"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Unset, the config's own table stands.
    let own_table = render(&[NVSENTINEL, values.to_str().unwrap(), "portStateHoldDown="]);
    let (code, out) = check_config(&own_table, &[]);
    assert_eq!(code, 0, "{out}");
}

/// `nicmon run <the rendered args> --check-config`, with the rendered ConfigMap as the
/// config file: exit code and output.
fn check_config(objects: &[Value], extra: &[&str]) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.toml");
    std::fs::write(&cfg, configmap(objects)["data"]["config.toml"].as_str().unwrap()).unwrap();
    let ds = daemonset(objects);
    // `$(VAR)` in args expands as kubelet does, from the container's downward-API env.
    let env = ds["spec"]["template"]["spec"]["containers"][0]["env"].as_array().unwrap().clone();
    let expand = |a: String| -> String {
        env.iter().fold(a, |a, e| {
            let value = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("status.hostIP") => "10.0.0.7",
                Some("spec.nodeName") => "gpu-node-1",
                _ => return a,
            };
            a.replace(&format!("$({})", e["name"].as_str().unwrap()), value)
        })
    };
    let mut argv: Vec<String> = args(ds)
        .into_iter()
        .map(expand)
        .map(|a| match a.starts_with("--config=") {
            true => format!("--config={}", cfg.display()),
            false => a,
        })
        .collect();
    argv.push("--check-config".into());
    argv.extend(extra.iter().map(|s| s.to_string()));
    let out = Command::new(nicmon_bin()).args(&argv).env("NODE_NAME", "gpu-node-1").output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn the_binary_accepts_the_rendered_flags_and_config() {
    for (what, objects) in renderings() {
        assert_eq!(args(daemonset(&objects))[0], "run", "{what}");
        let (code, out) = check_config(&objects, &[]);
        assert_eq!(code, 0, "{what}: {out}");
        assert!(out.contains("config file:") && out.contains("(read)"), "{what}: the ConfigMap was read: {out}");
        assert!(!out.contains("warning"), "{what}: {out}");
        assert!(out.contains("checks:            InfiniBandStateCheck"), "{what}: {out}");
    }
    // The check can fail: an unknown flag, a bad value, a broken config.
    let objects = render(&[]);
    assert_eq!(check_config(&objects, &["--no-such-flag"]).0, 2);
    let bad = render(&["processingStrategy=SOMETIMES"]);
    let (code, out) = check_config(&bad, &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("SOMETIMES"), "{out}");
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("bad-config.yaml");
    std::fs::write(&values, "config: |\n  nicExclusionRegex = \"(\"\n").unwrap();
    let (code, out) = check_config(&render(&[values.to_str().unwrap()]), &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("nicExclusionRegex"), "{out}");
}

#[test]
fn the_operator_guide_cli_reference_matches_nicmon_run_help() {
    let root = deploy::repo_root();
    let guide = std::fs::read_to_string(root.join(GUIDE)).unwrap();
    let help = capture(Command::new(nicmon_bin()).args(["run", "--help"]), "nicmon run --help").unwrap();
    let want = deploy::guide_with_cli(&guide, &help).unwrap();
    assert!(guide == want, "{GUIDE}: the command-line reference is stale: run `cargo xtask generate`");
}

/// No container engine runs here, so the build file is checked for what can be checked
/// offline: two stages, the runtime stage copies the build stage's binary to the path the
/// entrypoint runs, the build commands exist, the lock file is current, the context ignores
/// build output, and the image it documents is the one the chart runs.
#[test]
fn the_container_build_file_builds_what_the_chart_runs() {
    let root = deploy::repo_root();
    let text = std::fs::read_to_string(root.join("deploy/Dockerfile")).unwrap();
    // Logical lines (continuations joined), comments dropped.
    let joined = text.replace("\\\n", " ");
    let lines: Vec<&str> = joined.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    let stages: Vec<(&str, &str)> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("FROM "))
        .map(|f| {
            let parts: Vec<&str> = f.split_whitespace().collect();
            (parts[0], parts.get(2).copied().unwrap_or(""))
        })
        .collect();
    assert_eq!(stages.len(), 2, "multi-stage: {stages:?}");
    assert!(stages[0].0.contains("rust:") && stages[0].1 == "build", "{stages:?}");
    assert!(stages[1].0.contains("distroless"), "small runtime image: {stages:?}");
    let copy = lines.iter().find(|l| l.starts_with("COPY --from=")).expect("COPY --from");
    let parts: Vec<&str> = copy.split_whitespace().collect();
    assert_eq!(parts[1], "--from=build");
    let (built, installed) = (parts[2], parts[3]);
    let entry = lines.iter().find(|l| l.starts_with("ENTRYPOINT")).expect("ENTRYPOINT");
    assert_eq!(*entry, format!("ENTRYPOINT [\"{installed}\"]"));
    let run = lines.iter().filter(|l| l.starts_with("RUN ")).copied().collect::<Vec<_>>().join(" ");
    assert!(run.contains(&format!("target/release/nicmon {built}")), "{run}");
    assert!(run.contains("eBPF programs: built in"), "the image must embed the eBPF object: {run}");

    // Every `cargo xtask TASK` it runs exists; `--locked` holds with the committed lock file.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    for task in run.split("cargo xtask ").skip(1).map(|r| r.split_whitespace().next().unwrap()) {
        let st = Command::new(&cargo).current_dir(&root).args(["xtask", task, "--help"]).output().unwrap();
        assert!(st.status.success(), "cargo xtask {task}: {}", String::from_utf8_lossy(&st.stderr));
    }
    assert!(run.contains("cargo build --release --locked -p nicmon"), "{run}");
    let st = Command::new(&cargo)
        .current_dir(&root)
        .args(["build", "--quiet", "--locked", "-p", "nicmon", "--bin", "nicmon"])
        .output()
        .unwrap();
    assert!(st.status.success(), "Cargo.lock is stale: {}", String::from_utf8_lossy(&st.stderr));

    // The eBPF build's nightly is the dated one xtask pins (bpf-linker is built against its LLVM).
    let xtask = std::fs::read_to_string(root.join("xtask/src/build_ebpf.rs")).unwrap();
    let pinned = xtask
        .lines()
        .find_map(|l| l.strip_prefix("pub const TOOLCHAIN: &str = \"")?.strip_suffix("\";"))
        .expect("TOOLCHAIN in xtask/src/build_ebpf.rs");
    assert!(pinned.len() == "nightly-YYYY-MM-DD".len() && pinned.starts_with("nightly-2"), "a dated nightly: {pinned}");
    assert!(lines.contains(&format!("ARG EBPF_NIGHTLY={pinned}").as_str()), "deploy/Dockerfile pins {pinned}");
    assert!(run.contains("rustup toolchain install ${EBPF_NIGHTLY}"), "{run}");
    let toolchain_file = std::fs::read_to_string(root.join("nicmon-ebpf/rust-toolchain.toml")).unwrap();
    assert!(toolchain_file.contains(&format!("channel = \"{pinned}\"")), "nicmon-ebpf/rust-toolchain.toml");

    let ignore = std::fs::read_to_string(root.join("deploy/Dockerfile.dockerignore")).unwrap();
    for dir in ["target/", ".tools/", ".git/"] {
        assert!(ignore.lines().any(|l| l.trim() == dir), "build context keeps {dir}");
    }
    let objects = render(&[]);
    let image = daemonset(&objects)["spec"]["template"]["spec"]["containers"][0]["image"].as_str().unwrap().to_string();
    assert!(text.contains(&format!("-t {image} ")), "the Dockerfile's build example tags {image}");
}

/// Every value of the chart is in the operator guide's values table (a row names the value
/// itself, or a parent of it, as `parent` or `parent.*`).
#[test]
fn the_operator_guide_documents_every_chart_value() {
    fn leaves(prefix: &str, v: &Value, out: &mut Vec<String>) {
        match v.as_object() {
            Some(m) if !m.is_empty() => {
                for (k, v) in m {
                    leaves(&if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") }, v, out);
                }
            }
            _ => out.push(prefix.to_string()),
        }
    }
    let values: Value =
        serde_json::from_str(&capture(&mut k8s(&python(), &["values", CHART]), "values").unwrap()).unwrap();
    let mut paths = Vec::new();
    leaves("", &values, &mut paths);
    assert!(paths.len() > 30, "{paths:?}");
    let guide = std::fs::read_to_string(deploy::repo_root().join(GUIDE)).unwrap();
    let at = guide.find("### Helm values").expect("a \"### Helm values\" section");
    let section = &guide[at..at + guide[at..].find("\n## ").unwrap_or(guide.len() - at)];
    // First cells of the section's table rows: every backticked name in them.
    let documented: Vec<String> = section
        .lines()
        .filter_map(|l| l.strip_prefix("| ")?.split(" | ").next())
        .flat_map(|cell| cell.split('`').skip(1).step_by(2).map(|s| s.trim_end_matches(".*").to_string()))
        .collect();
    let missing: Vec<&String> = paths
        .iter()
        .filter(|p| {
            let segs: Vec<&str> = p.split('.').collect();
            !(1..=segs.len()).any(|n| documented.contains(&segs[..n].join(".")))
        })
        .collect();
    assert!(missing.is_empty(), "{GUIDE}: chart values not in the values table: {missing:?}");
}

/// Every key of the config file is in the operator guide's configuration reference. The keys
/// come from the binary itself: each section's unknown-key message lists the known ones.
#[test]
fn the_operator_guide_documents_every_config_key() {
    let dir = tempfile::tempdir().unwrap();
    let probe_with = |toml: &str, extra: &[&str]| -> String {
        let f = dir.path().join("probe.toml");
        std::fs::write(&f, toml).unwrap();
        let out = Command::new(nicmon_bin())
            .args(["run", "--check-config", "--config", f.to_str().unwrap()])
            .args(extra)
            .env("NODE_NAME", "probe-node")
            .output()
            .unwrap();
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    };
    let probe = |toml: &str| probe_with(toml, &[]);
    // "(known keys: a, b)", "expected `a` or `b`", "expected one of `a`, `b`", "expected one of a, b".
    fn listed(msg: &str) -> Vec<String> {
        let tail = msg
            .rsplit_once("known keys: ")
            .or_else(|| msg.rsplit_once("expected one of "))
            .or_else(|| msg.rsplit_once("expected "))
            .unwrap_or_else(|| panic!("no key list in {msg:?}"))
            .1;
        let tail = tail.lines().next().unwrap().trim_end_matches(')');
        tail.split([',', ' '])
            .map(|k| k.trim_matches('`'))
            .filter(|k| !k.is_empty() && *k != "or")
            .map(String::from)
            .collect()
    }
    let sections = [
        ("", "zzUnknown = 1\n"),
        ("stateDetection.", "[stateDetection]\nzzUnknown = 1\n"),
        ("stateCheck.", "[stateCheck]\nzzUnknown = 1\n"),
        ("counterDetection.", "[counterDetection]\nzzUnknown = 1\n"),
        ("counterDetection.counters[].", "[[counterDetection.counters]]\nname = \"x\"\nzzUnknown = 1\n"),
        ("kernelLog.", "[kernelLog]\nzzUnknown = 1\n"),
        ("kernelLog.patterns[].", "[[kernelLog.patterns]]\nname = \"x\"\nzzUnknown = 1\n"),
        ("charDeviceCheck.", "[charDeviceCheck]\nzzUnknown = 1\n"),
        ("pcieCheck.", "[pcieCheck]\nzzUnknown = 1\n"),
        ("phyCheck.", "[phyCheck]\nzzUnknown = 1\n"),
        ("thermalCheck.", "[thermalCheck]\nzzUnknown = 1\n"),
        ("firmwareCheck.", "[firmwareCheck]\nzzUnknown = 1\n"),
        ("opticsCheck.", "[opticsCheck]\nzzUnknown = 1\n"),
    ];
    let guide = std::fs::read_to_string(deploy::repo_root().join(GUIDE)).unwrap();
    let mut keys = Vec::new();
    for (prefix, toml) in sections {
        let msg = probe(toml);
        let line = msg.lines().find(|l| l.contains("zzUnknown")).unwrap_or_else(|| panic!("{toml}: {msg}"));
        let names = listed(line);
        assert!(!names.is_empty(), "{line}");
        keys.extend(names.into_iter().map(|k| format!("{prefix}{k}")));
    }
    // A section's own name is documented through its keys.
    let section = |k: &String| sections.iter().any(|(p, _)| *p == format!("{k}."));
    let missing: Vec<&String> = keys.iter().filter(|k| !section(k) && !guide.contains(&format!("`{k}`"))).collect();
    assert!(missing.is_empty(), "{GUIDE}: config keys not documented: {missing:?} (of {keys:?})");

    // The guide's example config is accepted as it stands, without a warning.
    let at = guide.find("### Example config.toml").expect("an example config section");
    let block = guide[at..].split("```toml\n").nth(1).unwrap().split("\n```").next().unwrap();
    // (It is the DaemonSet's file: the host's /sys is at /nvsentinel/sys there.)
    let out = probe_with(block, &["--sysfs", "/nvsentinel/sys"]);
    assert!(out.contains("ok: nicmon run would start") && !out.contains("warning"), "{out}");
}

/// `prometheusRule.enabled` renders deploy/prometheus/nicmon-rules.yaml as a PrometheusRule:
/// the file's groups as they are, less the group for what the release does not run (the
/// kernel log off, eBPF off), with absolute runbook links when `runbookBaseUrl` is set.
#[test]
fn prometheus_rule_renders_the_rules_file() {
    let root = deploy::repo_root();
    assert!(
        std::fs::read(root.join(RULES)).unwrap() == std::fs::read(root.join(CHART_RULES)).unwrap_or_default(),
        "{CHART_RULES} is stale: run `cargo xtask generate`"
    );
    let file = load(RULES);
    let groups = file[0]["groups"].as_array().unwrap();
    let without = |name: &str| -> Vec<Value> { groups.iter().filter(|g| g["name"] != name).cloned().collect() };
    let rule_of = |objects: &[Value]| -> Value {
        let rules: Vec<&Value> = objects.iter().filter(|o| o["kind"] == "PrometheusRule").collect();
        assert_eq!(rules.len(), 1, "{:?}", kinds(objects));
        rules[0].clone()
    };
    assert!(!kinds(&render(&[])).contains(&"PrometheusRule"), "off by default");

    // Default values: the kernel log is off, so its group is left out.
    let objects = render(&["prometheusRule.enabled=true", "prometheusRule.labels.release=kube-prometheus-stack"]);
    let rule = rule_of(&objects);
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["metadata"]["namespace"], "nvsentinel");
    assert_eq!(rule["metadata"]["labels"]["release"], "kube-prometheus-stack");
    assert_eq!(rule["metadata"]["labels"]["app.kubernetes.io/name"], "nicmon");
    assert_eq!(rule["spec"]["groups"].as_array().unwrap(), &without("nicmon-kernel-log"));
    // The other objects are as without it (the validator has no schema for the CRD).
    let rest: Vec<Value> = objects.into_iter().filter(|o| o["kind"] != "PrometheusRule").collect();
    assert_eq!(rest, render(&[]));

    // The kernel log watched and eBPF off: the eBPF group goes instead.
    let objects = render(&[
        "prometheusRule.enabled=true",
        "kernelLog.enabled=true",
        "securityContext.privileged=true",
        "wake.ebpf=false",
    ]);
    assert_eq!(rule_of(&objects)["spec"]["groups"].as_array().unwrap(), &without("nicmon-ebpf"));

    // Absolute runbook links; nothing else changes.
    let base = "https://git.example.org/nicmon/blob/main/docs/operator-guide.md";
    let objects = render(&["prometheusRule.enabled=true", &format!("prometheusRule.runbookBaseUrl={base}")]);
    let linked = rule_of(&objects)["spec"]["groups"].clone();
    let mut want = without("nicmon-kernel-log");
    let mut alerts = 0;
    for rule in want.iter_mut().flat_map(|g| g["rules"].as_array_mut().unwrap()) {
        if let Some(url) = rule["annotations"]["runbook_url"].as_str() {
            let anchor = url.strip_prefix("docs/operator-guide.md#").expect("a runbook in the operator guide");
            rule["annotations"]["runbook_url"] = json!(format!("{base}#{anchor}"));
            alerts += 1;
        }
    }
    assert!(alerts > 10, "{alerts} alerts");
    assert_eq!(linked, json!(want));
}
