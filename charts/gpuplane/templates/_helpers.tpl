{{/* Labels every object carries (the kustomize base adds the same, with managed-by: kustomize). */}}
{{- define "gpuplane.labels" -}}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpuplane
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* Labels of the driver's objects: pass the root context. */}}
{{- define "gpuplane.driverLabels" -}}
app.kubernetes.io/component: driver
app.kubernetes.io/name: gpuplane-driver
{{ include "gpuplane.labels" . }}
{{- end }}

{{- define "gpuplane.controllerLabels" -}}
app.kubernetes.io/component: controller
app.kubernetes.io/name: gpuplane-controller
{{ include "gpuplane.labels" . }}
{{- end }}

{{/* <registry>/<name>:<tag or appVersion>; pass (list $ .Values.image.driver). */}}
{{- define "gpuplane.image" -}}
{{- $root := index . 0 -}}
{{- $img := index . 1 -}}
{{- printf "%s/%s:%s" $root.Values.image.registry $img.name (default $root.Chart.AppVersion $img.tag) -}}
{{- end }}
