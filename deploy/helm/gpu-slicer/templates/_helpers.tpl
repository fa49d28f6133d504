{{/*
Labels. Object names are fixed (gpu-slicer-*), not prefixed with the release name: the webhook
configuration, the Secret and the ServiceAccounts are named in flags, RBAC and the agent's
ValidatingAdmissionPolicy, and the DeviceClasses are cluster-wide, so one release per cluster.
Call with (dict "root" $ "component" "webhook"); "component" may be empty, "name" false leaves
app.kubernetes.io/name out, "managedBy" overrides app.kubernetes.io/managed-by.
*/}}
{{- define "gpu-slicer.labels" -}}
{{- if ne (toString .name) "false" -}}
app.kubernetes.io/name: gpu-slicer
{{ end -}}
{{- with .component -}}
app.kubernetes.io/component: {{ . }}
{{ end -}}
app.kubernetes.io/part-of: gpu-slicer
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .managedBy | default .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end }}

{{- define "gpu-slicer.selector" -}}
app.kubernetes.io/name: gpu-slicer
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gpu-slicer.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "gpu-slicer.mode" -}}
{{- $mode := .Values.certificates.mode -}}
{{- if not (has $mode (list "self-managed" "cert-manager" "openshift" "external")) -}}
{{- fail (printf "certificates.mode %q is not one of self-managed, cert-manager, openshift, external" $mode) -}}
{{- end -}}
{{- if and (eq $mode "external") .Values.webhook.enabled (not .Values.webhook.caBundle) -}}
{{- fail "certificates.mode external needs webhook.caBundle (the base64 CA of Secret gpu-slicer-webhook-tls)" -}}
{{- end -}}
{{- if and (not .Values.webhook.enabled) (not .Values.webhook.url) -}}
{{- fail "webhook.enabled false needs webhook.url: where the apiserver reaches the webhook" -}}
{{- end -}}
{{- if and .Values.webhook.url .Values.webhook.enabled -}}
{{- fail "webhook.url is for a webhook outside the cluster: set webhook.enabled false with it" -}}
{{- end -}}
{{- if and .Values.webhook.url (not .Values.webhook.caBundle) -}}
{{- fail "webhook.url needs webhook.caBundle: the base64 CA that signed that webhook's certificate" -}}
{{- end -}}
{{- $mode -}}
{{- end }}

{{- define "gpu-slicer.serviceHost" -}}
gpu-slicer-webhook.{{ .Release.Namespace }}.svc
{{- end }}
