{{/* The chart's name, and the prefix of every object's name. */}}
{{- define "cronoq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-cronoq, or <release> when the release name already contains the chart's name. */}}
{{- define "cronoq.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "cronoq.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "cronoq.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "cronoq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cronoq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end }}

{{/*
The server groups to deploy, as YAML {units: [...]}: one per shard, or a single one without
shards. Each has name (of its Deployment, Service and budget), shard ("" without shards),
replicas and host (the shard Service's DNS name).
*/}}
{{- define "cronoq.units" -}}
{{- $full := include "cronoq.fullname" . }}
{{- $units := list }}
{{- if .Values.shards }}
{{- range .Values.shards }}
{{- $name := printf "%s-%s" $full .name | trunc 63 | trimSuffix "-" }}
{{- $replicas := (hasKey . "replicas") | ternary .replicas $.Values.replicas }}
{{- $units = append $units (dict "name" $name "shard" .name "replicas" $replicas "host" (printf "%s.%s.svc" $name $.Release.Namespace)) }}
{{- end }}
{{- else }}
{{- $units = append $units (dict "name" $full "shard" "" "replicas" .Values.replicas "host" (printf "%s.%s.svc" $full .Release.Namespace)) }}
{{- end }}
{{- dict "units" $units | toYaml }}
{{- end }}

{{- define "cronoq.tokensSecret" -}}
{{- .Values.auth.existingSecret | default (printf "%s-tokens" (include "cronoq.fullname" .)) }}
{{- end }}

{{- define "cronoq.databaseSecret" -}}
{{- .Values.store.postgres.urlSecret.name | default (printf "%s-database" (include "cronoq.fullname" .)) }}
{{- end }}

{{- define "cronoq.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "cronoq.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "cronoq.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* The Postgres schema: store.postgres.schema, or cronoq / cronoq_{shard}. */}}
{{- define "cronoq.schema" -}}
{{- if .Values.store.postgres.schema }}
{{- .Values.store.postgres.schema }}
{{- else if .Values.shards }}
{{- "cronoq_{shard}" }}
{{- else }}
{{- "cronoq" }}
{{- end }}
{{- end }}

{{/* Refuse values that would deploy something that cannot work, naming the value to change. */}}
{{- define "cronoq.validate" -}}
{{- if and .Values.shards (not .Values.tls.secretName) (not .Values.insecurePeerHttp) }}
{{- fail "shards: servers forward callers' tokens to other shards, so the shard endpoints must be encrypted or trusted: set tls.secretName (a Secret with tls.crt, tls.key and ca.crt naming every shard Service) or insecurePeerHttp: true (trusted cluster networks only)" }}
{{- end }}
{{- if eq .Values.store.kind "postgres" }}
{{- if and (not .Values.store.postgres.urlSecret.name) (not .Values.store.postgres.url) }}
{{- fail "store.postgres: name the Secret holding the database URL (store.postgres.urlSecret.name, key store.postgres.urlSecret.key) or give store.postgres.url" }}
{{- end }}
{{- if and .Values.shards (not (contains "{shard}" (include "cronoq.schema" .))) }}
{{- fail "store.postgres.schema: with shards the schema must contain {shard} (for example cronoq_{shard}), so that every shard has tables of its own" }}
{{- end }}
{{- end }}
{{- if eq .Values.store.kind "memory" }}
{{- $units := (include "cronoq.units" . | fromYaml).units }}
{{- range $units }}
{{- if gt (int .replicas) 1 }}
{{- fail (printf "store.kind memory keeps state in each process, so standbys would be independent leaders: use replicas: 1 for %s, or store.kind postgres" .name) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and .Values.tls.clientAuth (not .Values.tls.secretName) }}
{{- fail "tls.clientAuth needs tls.secretName" }}
{{- end }}
{{- if and .Values.tls.clientAuth (not .Values.server.metricsPort) }}
{{- fail "tls.clientAuth: the kubelet's probes present no client certificate, so set server.metricsPort: probes then use that plain listener" }}
{{- end }}
{{- end }}

{{/* Port and scheme of the probes: the plain metrics listener when there is one. */}}
{{- define "cronoq.probe" -}}
httpGet:
  path: /healthz
{{- if .Values.server.metricsPort }}
  port: metrics
  scheme: HTTP
{{- else }}
  port: http
  scheme: {{ if .Values.tls.secretName }}HTTPS{{ else }}HTTP{{ end }}
{{- end }}
{{- end }}

{{/* The ports of every Service. */}}
{{- define "cronoq.servicePorts" -}}
- name: grpc
  port: {{ .Values.service.grpcPort }}
  targetPort: grpc
  protocol: TCP
  appProtocol: grpc
- name: http
  port: {{ .Values.service.httpPort }}
  targetPort: http
  protocol: TCP
{{- if .Values.server.metricsPort }}
- name: metrics
  port: {{ .Values.server.metricsPort }}
  targetPort: metrics
  protocol: TCP
{{- end }}
{{- end }}
