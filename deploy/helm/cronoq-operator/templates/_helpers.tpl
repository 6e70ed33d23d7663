{{- define "cronoq-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-cronoq-operator, or <release> when the release name already contains it. */}}
{{- define "cronoq-operator.fullname" -}}
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

{{- define "cronoq-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cronoq-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "cronoq-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "cronoq-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "cronoq-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "cronoq-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "cronoq-operator.validate" -}}
{{- $names := list }}
{{- range .Values.servers }}
{{- if has .name $names }}
{{- fail (printf "servers: %q is named twice" .name) }}
{{- end }}
{{- $names = append $names .name }}
{{- if and .caSecret (not (hasPrefix "https://" .url)) }}
{{- fail (printf "servers[%s].caSecret: only for an https:// url" .name) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Non-empty when a server has a CA Secret. */}}
{{- define "cronoq-operator.cas" -}}
{{- range .Values.servers }}{{ if .caSecret }}yes{{ end }}{{ end }}
{{- end }}
