{{/*
The application's name: the chart's, or `nameOverride`. It is the app.kubernetes.io/name label
of the operator's objects (and so part of its pods' selector).
*/}}
{{- define "egress-proxies.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The name of every namespaced object of the release: `fullnameOverride`, else the release
name when it already holds the application's name, else RELEASE-NAME. Helm release names
are unique per namespace, so this is unique among the objects of one namespace.
*/}}
{{- define "egress-proxies.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The name of the objects that live outside the release namespace (the ClusterRole and its
binding, the Role and RoleBinding in `watchNamespace`, and anything a template puts in
another namespace): NAMESPACE.FULLNAME. Two releases of the same name in two namespaces
differ in NAMESPACE, and a namespace never holds a dot, so the part before the first dot
tells the release namespace apart: no two releases share these names. A valid DNS subdomain
(at most 63 + 1 + 63 characters), so any kind may carry it, with a suffix if needed.
*/}}
{{- define "egress-proxies.clusterName" -}}
{{- printf "%s.%s" .Release.Namespace (include "egress-proxies.fullname" .) -}}
{{- end -}}

{{/* Labels on every object: the standard app.kubernetes.io set and helm.sh/chart. */}}
{{- define "egress-proxies.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "egress-proxies.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: egress-proxies
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The selector of the operator's pods. */}}
{{- define "egress-proxies.selector" -}}
app.kubernetes.io/name: {{ include "egress-proxies.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
The labels of the `helm test` pod: the standard set, but not the operator's selector (a
Deployment's ReplicaSet adopts an orphan pod its selector matches, and the Services would
send it traffic).
*/}}
{{- define "egress-proxies.testLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "egress-proxies.name" . | trunc 58 | trimSuffix "-" }}-test
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: test
app.kubernetes.io/part-of: egress-proxies
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The selector of the `helm test` pod (the NetworkPolicy admits it to the status port). */}}
{{- define "egress-proxies.testSelector" -}}
app.kubernetes.io/name: {{ include "egress-proxies.name" . | trunc 58 | trimSuffix "-" }}-test
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The Lease of leader election: `leaderElection.leaseName`, else FULLNAME-leader. */}}
{{- define "egress-proxies.leaseName" -}}
{{- .Values.leaderElection.leaseName | default (printf "%s-leader" (include "egress-proxies.fullname" .)) -}}
{{- end -}}

{{/*
Whether the status views are served beyond loopback (then a Service `FULLNAME-status` exposes
them, and `helm test` reads them through it).
*/}}
{{- define "egress-proxies.statusExposed" -}}
{{- $a := .Values.status.address -}}
{{- if and .Values.status.enabled (not (or (hasPrefix "127." $a) (eq $a "::1"))) -}}
true
{{- end -}}
{{- end -}}

{{/* The status listener's ADDR:PORT for --status-listen (an IPv6 address in brackets). */}}
{{- define "egress-proxies.statusListen" -}}
{{- if contains ":" .Values.status.address -}}
{{- printf "[%s]:%v" .Values.status.address .Values.status.port -}}
{{- else -}}
{{- printf "%s:%v" .Values.status.address .Values.status.port -}}
{{- end -}}
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
  verbs: ["create", "delete", "list", "patch", "watch"]
- apiGroups: ["egress-proxies.dev"]
  resources: ["proxies/status"]
  verbs: ["patch"]
- apiGroups: ["egress-proxies.dev"]
  resources: ["proxies/finalizers"]
  verbs: ["update"]
- apiGroups: ["egress-proxies.dev"]
  resources: ["proxypools"]
  verbs: ["list", "patch", "watch"]
- apiGroups: ["egress-proxies.dev"]
  resources: ["proxypools/status"]
  verbs: ["patch"]
- apiGroups: ["egress-proxies.dev"]
  resources: ["proxypools/finalizers"]
  verbs: ["update"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["create", "delete", "get", "list", "patch"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["create", "delete", "get", "list", "patch"]
{{- end -}}

{{/*
The namespaces whose Secrets the operator may read (by name) and create: `secretNamespaces`,
else the watched namespace when one is set, else none. Never cluster-wide.
*/}}
{{- define "egress-proxies.secretNamespaces" -}}
{{- $ns := .Values.secretNamespaces -}}
{{- if and (not $ns) .Values.watchNamespace -}}
{{- $ns = list .Values.watchNamespace -}}
{{- end -}}
{{- toJson (uniq $ns) -}}
{{- end -}}

{{/*
The pool gateway's pods: their own app.kubernetes.io/name (NAME-gateway), so neither the
operator's Deployment nor its Services ever select them, and component `gateway`.
*/}}
{{- define "egress-proxies.gatewayName" -}}
{{- printf "%s-gateway" (include "egress-proxies.name" . | trunc 55 | trimSuffix "-") -}}
{{- end -}}

{{- define "egress-proxies.gatewayFullname" -}}
{{- printf "%s-gateway" (include "egress-proxies.fullname" . | trunc 55 | trimSuffix "-") -}}
{{- end -}}

{{- define "egress-proxies.gatewayLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "egress-proxies.gatewayName" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: gateway
app.kubernetes.io/part-of: egress-proxies
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "egress-proxies.gatewaySelector" -}}
app.kubernetes.io/name: {{ include "egress-proxies.gatewayName" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
The pool gateway's grants (crates/egress-kube/src/rbac.rs, GATEWAY_API_ACCESS): read-only,
where the pools are watched (Secrets apart: gateway-rbac.yaml grants `get` in the
secretNamespaces only).
*/}}
{{- define "egress-proxies.gatewayRules" -}}
- apiGroups: ["egress-proxies.dev"]
  resources: ["proxypools"]
  verbs: ["list", "watch"]
- apiGroups: ["egress-proxies.dev"]
  resources: ["proxies"]
  verbs: ["list", "watch"]
{{- end -}}

{{/* Whole seconds of a duration value (`30s`, `2m`, `1h`, `1m30s`). */}}
{{- define "egress-proxies.seconds" -}}
{{- $total := 0 -}}
{{- range (regexFindAll "[0-9]+(ms|s|m|h)" . -1) -}}
{{- $n := regexFind "^[0-9]+" . | int -}}
{{- if hasSuffix "ms" . -}}
{{- else if hasSuffix "s" . -}}{{- $total = add $total $n -}}
{{- else if hasSuffix "m" . -}}{{- $total = add $total (mul $n 60) -}}
{{- else if hasSuffix "h" . -}}{{- $total = add $total (mul $n 3600) -}}
{{- end -}}
{{- end -}}
{{- $total -}}
{{- end -}}
