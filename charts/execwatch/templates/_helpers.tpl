{{/* Names are fixed: deploy/base's RBAC names the ServiceAccounts and the Lease. */}}
{{- define "execwatch.agentName" -}}execwatch-agent{{- end -}}
{{- define "execwatch.handlerName" -}}execwatch-handler{{- end -}}
{{- define "execwatch.placementName" -}}execwatch-placement{{- end -}}

{{- define "execwatch.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "execwatch.labels" -}}
app.kubernetes.io/name: execwatch
{{- if not .Values.plainManifests }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- if .Values.plainManifests }}
app.kubernetes.io/managed-by: kustomize
{{- else }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component (agent or handler). */}}
{{- define "execwatch.selector" -}}
app.kubernetes.io/name: execwatch
app.kubernetes.io/component: {{ . }}
{{- end -}}

{{/* Labels of one component: common labels + selector. Call with (list $ "agent"). */}}
{{- define "execwatch.componentLabels" -}}
{{ include "execwatch.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* RBAC rules of one role, from files/rbac-rules.yaml (generated from deploy/base). */}}
{{- define "execwatch.rules" -}}
{{- $all := .root.Files.Get "files/rbac-rules.yaml" | fromYaml -}}
{{- $rules := index $all .key -}}
{{- if not $rules -}}{{- fail (printf "files/rbac-rules.yaml has no %s" .key) -}}{{- end -}}
{{ toYaml $rules }}
{{- end -}}
