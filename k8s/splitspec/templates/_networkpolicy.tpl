{{/* Rules the NetworkPolicies share. */}}

{{/* DNS, and the OTLP collector when tracing is on: ($) */}}
{{- define "splitspec.commonEgress" -}}
- ports:
    - {port: 53, protocol: UDP}
    - {port: 53, protocol: TCP}
{{- if .Values.otel.enabled }}
- ports:
    - {port: {{ int .Values.networkPolicy.collectorPort }}, protocol: TCP}
  {{- with .Values.networkPolicy.collectorTo }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end }}
{{/* Prometheus scrapes of a metrics port: (dict "root" $ "port" 9400) */}}
{{- define "splitspec.metricsIngress" -}}
{{- if .root.Values.metrics.enabled }}
- ports:
    - {port: {{ int .port }}, protocol: TCP}
  from:
    {{- with .root.Values.networkPolicy.metricsFrom }}
    {{- toYaml . | nindent 4 }}
    {{- else }}
    - namespaceSelector: {}
    {{- end }}
{{- end }}
{{- end }}
{{/* The ranks of a verifier group over several hosts reach each other on any port (the
rendezvous port, then the collectives' own connections): (dict "root" $ "key" "from" | "to") */}}
{{- define "splitspec.verifierRanks" -}}
- {{ .key }}:
    - podSelector:
        matchLabels:
          {{- include "splitspec.selectorLabels" (dict "root" .root "component" "verifier") | nindent 10 }}
{{- end }}
