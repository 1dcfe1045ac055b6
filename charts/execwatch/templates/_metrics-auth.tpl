{{/* metricsAuth: the pieces the agent's and the handler's pod specs include.
     Each takes (list $ "agent") or (list $ "handler"). */}}

{{- define "execwatch.metricsAuthArgs" -}}
{{- $ := index . 0 -}}
{{- $m := $.Values.metricsAuth -}}
{{- if $m.enabled }}
- --metrics-auth
{{- range $m.audiences }}
- --metrics-auth-audience={{ . }}
{{- end }}
{{- if index $m.tlsSecret (index . 1) }}
- --metrics-tls-cert=/etc/execwatch/metrics-tls/tls.crt
- --metrics-tls-key=/etc/execwatch/metrics-tls/tls.key
{{- end }}
{{- end }}
{{- end -}}

{{/* A probe's httpGet of `path`; when scrapes need a token, over HTTPS and /metrics becomes /healthz. */}}
{{- define "execwatch.metricsGet" -}}
{{- $ := index . 0 -}}
{{- if $.Values.metricsAuth.enabled -}}
path: {{ eq (index . 1) "/metrics" | ternary "/healthz" (index . 1) }}
port: metrics
scheme: HTTPS
{{- else -}}
path: {{ index . 1 }}
port: metrics
{{- end -}}
{{- end -}}

{{- define "execwatch.metricsTLSMount" -}}
{{- $ := index . 0 -}}
{{- if and $.Values.metricsAuth.enabled (index $.Values.metricsAuth.tlsSecret (index . 1)) }}
# The metrics port's serving certificate (metricsAuth.tlsSecret).
- name: metrics-tls
  mountPath: /etc/execwatch/metrics-tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "execwatch.metricsTLSVolume" -}}
{{- $ := index . 0 -}}
{{- $secret := index $.Values.metricsAuth.tlsSecret (index . 1) -}}
{{- if and $.Values.metricsAuth.enabled $secret }}
- name: metrics-tls
  secret:
    secretName: {{ $secret }}
{{- end }}
{{- end -}}
