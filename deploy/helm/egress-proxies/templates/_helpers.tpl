{{/* The name of every object of the release. */}}
{{- define "egress-proxies.fullname" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "egress-proxies.labels" -}}
app.kubernetes.io/name: egress-proxies
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
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
