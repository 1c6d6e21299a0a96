{{/* The chart's name, overridable. */}}
{{- define "nicmon.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name: the release name alone when it already contains the chart name. */}}
{{- define "nicmon.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "nicmon.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "nicmon.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "nicmon.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nicmon.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "nicmon.labels" -}}
{{ include "nicmon.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: nic-health-monitor
app.kubernetes.io/part-of: nicmon
{{- end -}}

{{- define "nicmon.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "nicmon.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Fixed container paths: the host's /sys and /proc under /nvsentinel, as NVSentinel mounts them. */}}
{{- define "nicmon.hostSys" -}}/nvsentinel/sys{{- end -}}
{{- define "nicmon.hostProc" -}}/nvsentinel/proc{{- end -}}
{{- define "nicmon.configDir" -}}/etc/nic-health-monitor{{- end -}}
{{- define "nicmon.tokenDir" -}}/var/run/secrets/nicmon{{- end -}}
{{- define "nicmon.publishCaDir" -}}/etc/nicmon/publish-ca{{- end -}}

{{/* NVSentinel's umbrella-chart globals (global.*), where set, win over this chart's own values. */}}
{{- define "nicmon.metricsPort" -}}
{{- (.Values.global | default dict).metricsPort | default .Values.metrics.port -}}
{{- end -}}
{{- define "nicmon.metadataPath" -}}
{{- (.Values.global | default dict).metadataPath | default (printf "%s/%s" .Values.metadata.hostDir .Values.metadata.file) -}}
{{- end -}}
{{- define "nicmon.imageTag" -}}
{{- .Values.image.tag | default (dig "image" "tag" "" (.Values.global | default dict)) | default .Chart.AppVersion -}}
{{- end -}}
{{/* Direct publishing to the deployment platform connector (publishTo: deployment). */}}
{{- define "nicmon.direct" -}}
{{- if eq (toString .Values.publishTo) "deployment" -}}true{{- end -}}
{{- end -}}
{{/* A projected service-account token is mounted: connector auth on, or direct publishing. */}}
{{- define "nicmon.token" -}}
{{- if or .Values.platformConnector.token.enabled (dig "platformConnectorAuth" "enabled" false (.Values.global | default dict)) (include "nicmon.direct" .) -}}true{{- end -}}
{{- end -}}
{{- define "nicmon.tokenAudience" -}}
{{- $g := .Values.global | default dict -}}
{{- if include "nicmon.direct" . -}}
{{- dig "platformConnectorDeployment" "auth" "audience" .Values.platformConnector.token.audience $g -}}
{{- else -}}
{{- dig "platformConnectorAuth" "audience" .Values.platformConnector.token.audience $g -}}
{{- end -}}
{{- end -}}
{{- define "nicmon.tokenExpiration" -}}
{{- dig "platformConnectorAuth" "tokenExpirationSeconds" .Values.platformConnector.token.expirationSeconds (.Values.global | default dict) -}}
{{- end -}}

{{- define "nicmon.grpc" -}}
{{- if eq (toString .Values.sink) "grpc" -}}true{{- end -}}
{{- end -}}

{{/* The arguments of `nicmon run`. */}}
{{- define "nicmon.args" -}}
- run
{{- if .Values.logging.json }}
- --log-json
{{- end }}
- --sysfs={{ include "nicmon.hostSys" . }}
- --procfs={{ include "nicmon.hostProc" . }}
- --config={{ include "nicmon.configDir" . }}/config.toml
- --metadata-path={{ include "nicmon.metadataPath" . }}
{{- if .Values.metadata.required }}
- --metadata-required
{{- end }}
- --checks={{ join "," .Values.checks }}
- --state-polling-interval={{ .Values.statePollingInterval }}
- --state-file={{ .Values.stateDir }}/state.json
- --sink={{ .Values.sink }}
{{- if include "nicmon.grpc" . }}
- --platform-connector-socket=unix://{{ .Values.platformConnector.hostDir }}/{{ .Values.platformConnector.socketName }}
{{- if and (include "nicmon.token" .) (not (include "nicmon.direct" .)) }}
- --platform-connector-token-path={{ include "nicmon.tokenDir" . }}/token
{{- end }}
{{- end }}
- --processing-strategy={{ .Values.processingStrategy }}
- --poll-stall-deadline={{ .Values.pollStallDeadline }}
- --poll-stall-store-only={{ .Values.pollStallStoreOnly }}
{{- if .Values.metrics.enabled }}
- --metrics-port={{ include "nicmon.metricsPort" . }}
- --metrics-bind-address={{ .Values.metrics.bindAddress | default "$(HOST_IP)" }}
{{- else }}
- --no-metrics
{{- end }}
{{- if not .Values.kernelLog.enabled }}
- --no-kmsg
{{- end }}
{{- if not .Values.wake.ebpf }}
- --no-ebpf
{{- end }}
{{- if not .Values.wake.rtnetlink }}
- --no-rtnetlink
{{- end }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}
