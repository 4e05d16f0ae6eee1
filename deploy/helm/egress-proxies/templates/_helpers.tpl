{{/* The name of every object of the release. */}}
{{- define "egress-proxies.fullname" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object: the standard app.kubernetes.io set and helm.sh/chart. */}}
{{- define "egress-proxies.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: egress-proxies
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: egress-proxies
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The selector of the operator's pods. */}}
{{- define "egress-proxies.selector" -}}
app.kubernetes.io/name: egress-proxies
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "egress-proxies.configMapName" -}}
{{- .Values.providerConfig.existingConfigMap | default (include "egress-proxies.fullname" .) -}}
{{- end -}}

{{/* The image reference; the repository must be set (no public registry serves it). */}}
{{- define "egress-proxies.image" -}}
{{- $repo := required "image.repository is required: build the image with scripts/build-image and push it to a registry your cluster pulls from" .Values.image.repository -}}
{{- printf "%s:%s" $repo (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/*
Grants the operator needs only where it watches Proxies (crates/egress-kube/src/rbac.rs,
Scope::WatchedNamespaces): a Role in watchNamespace, or part of the ClusterRole when every
namespace is watched.
*/}}
{{- define "egress-proxies.watchedRules" -}}
- apiGroups: ["egress-proxies.dev"]
  resources: ["proxies"]
  verbs: ["list", "patch", "watch"]
- apiGroups: ["egress-proxies.dev"]
  resources: ["proxies/status"]
  verbs: ["patch"]
- apiGroups: ["egress-proxies.dev"]
  resources: ["proxies/finalizers"]
  verbs: ["update"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["create", "delete", "get", "list", "patch"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["create", "delete", "get", "list", "patch"]
{{- end -}}
