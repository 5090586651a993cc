{{/* Chart name. */}}
{{- define "agentbox.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name prefix of the release's objects. */}}
{{- define "agentbox.fullname" -}}
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

{{/* Labels of every object. */}}
{{- define "agentbox.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "agentbox.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels that select the operator pods. */}}
{{- define "agentbox.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agentbox.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The operator's ServiceAccount name. */}}
{{- define "agentbox.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "agentbox.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Namespace of the leader-election Lease. */}}
{{- define "agentbox.leaseNamespace" -}}
{{- default .Release.Namespace .Values.leaderElection.namespace }}
{{- end }}

{{/* The operator image reference. */}}
{{- define "agentbox.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Labels of the CRDs: the release's, without the component (they serve every component). */}}
{{- define "agentbox.crdLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "agentbox.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The namespace where the operator manages Sandboxes that `helm test` uses. */}}
{{- define "agentbox.testNamespace" -}}
{{- default .Release.Namespace .Values.watchNamespace }}
{{- end }}

{{/* Labels that select the egress proxy's pods (the operator's --egress-proxy-selector). */}}
{{- define "agentbox.proxySelectorLabels" -}}
app.kubernetes.io/name: {{ include "agentbox.name" . }}-proxy
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of the egress proxy's objects. */}}
{{- define "agentbox.proxyLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "agentbox.proxySelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: egress-proxy
{{- end }}

{{/* The egress proxy's URL as sandboxes reach it (AGENTBOX_EGRESS_PROXY_URL). */}}
{{- define "agentbox.proxyUrl" -}}
{{- if .Values.egressProxy.url }}
{{- .Values.egressProxy.url }}
{{- else if .Values.egressProxy.service.clusterIP }}
{{- printf "http://%s:%v" .Values.egressProxy.service.clusterIP .Values.egressProxy.port }}
{{- else }}
{{- printf "http://%s-proxy.%s.svc:%v" (include "agentbox.fullname" .) .Release.Namespace .Values.egressProxy.port }}
{{- end }}
{{- end }}

{{/* The operator's --egress-proxy-selector: the proxy pods' selector labels as key=value,… */}}
{{- define "agentbox.proxySelector" -}}
{{- printf "app.kubernetes.io/name=%s-proxy,app.kubernetes.io/instance=%s" (include "agentbox.name" .) .Release.Name }}
{{- end }}
