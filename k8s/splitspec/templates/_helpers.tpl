{{/* Names, labels and the pieces every workload shares. */}}

{{- define "splitspec.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "splitspec.fullname" -}}
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

{{/* Name of one component's objects: (dict "root" $ "component" "verifier") */}}
{{- define "splitspec.componentName" -}}
{{- printf "%s-%s" (include "splitspec.fullname" .root) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "splitspec.selectorLabels" -}}
app.kubernetes.io/name: {{ include "splitspec.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- if .method }}
splitspec.io/method: {{ .method }}
{{- end }}
{{- end }}

{{- define "splitspec.labels" -}}
{{ include "splitspec.selectorLabels" . }}
app.kubernetes.io/part-of: splitspec
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end }}

{{- define "splitspec.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "splitspec.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The device a component runs on: its own `device`, else the release's. (dict "root" $ "device" "") */}}
{{- define "splitspec.device" -}}
{{- $name := default .root.Values.device .device }}
{{- if not (hasKey .root.Values.devices $name) }}
{{- fail (printf "unknown device %q: one of %s" $name (keys .root.Values.devices | sortAlpha | join ", ")) }}
{{- end }}
{{- $name }}
{{- end }}

{{/* Service image for a device: (dict "root" $ "device" "mlu") */}}
{{- define "splitspec.image" -}}
{{- $tag := default (printf "%s-%s" .root.Chart.AppVersion .device) .root.Values.image.tag }}
{{- printf "%s:%s" .root.Values.image.repository $tag }}
{{- end }}

{{/* resources plus the accelerator, if the device has one: (dict "root" $ "device" "mlu" "count" 1 "resources" {...}) */}}
{{- define "splitspec.resources" -}}
{{- $res := deepCopy (default dict .resources) }}
{{- $accel := (get .root.Values.devices .device).resource }}
{{- if and $accel (gt (int .count) 0) }}
{{- $limits := default dict (get $res "limits") }}
{{- $_ := set $limits $accel (int .count) }}
{{- $_ := set $res "limits" $limits }}
{{- end }}
{{- toYaml $res }}
{{- end }}

{{/* A container's default torch threads, its OMP_NUM_THREADS (a --threads flag in its `flags`
wins): 1 for a CPU-trivial one (light: the gateway, a proposer without a model), else the whole
cores of its CPU limit, else of its request, at least 1 (splitspec/launcher/threads.py's
threads_for_cpus); nothing without either. (dict "resources" {...} "light" false) */}}
{{- define "splitspec.threads" -}}
{{- $res := default dict .resources }}
{{- $cpu := or (dig "limits" "cpu" "" $res) (dig "requests" "cpu" "" $res) | toString }}
{{- if .light }}1
{{- else if $cpu }}
{{- $cores := ternary (divf (trimSuffix "m" $cpu | float64) 1000) ($cpu | float64) (hasSuffix "m" $cpu) }}
{{- max 1 (floor $cores | int) }}
{{- end }}
{{- end }}

{{/* A component's flags are a list of {flag, key, value}: the chart's own first, then the
user's `flags` map (a user flag may not repeat one the chart sets from its own values).
Values go to the component's ConfigMap as SPLITSPEC_<KEY>; the container's args are
--flag=$(SPLITSPEC_<KEY>), which the kubelet expands from the ConfigMap (envFrom). Booleans
are literal args (--flag / --no-flag): argparse takes no value for them.
(dict "own" (list ...) "user" .Values.verifier.flags "where" "verifier.flags") */}}
{{- define "splitspec.flags" -}}
{{- $out := .own }}
{{- $taken := list }}
{{- range .own }}{{ $taken = append $taken .flag }}{{ end }}
{{- range $flag, $value := .user }}
{{- if has $flag $taken }}
{{- fail (printf "%s: --%s is set by the chart from its own values" $.where $flag) }}
{{- end }}
{{- $out = append $out (dict "flag" $flag "key" ($flag | upper | replace "-" "_") "value" $value) }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{- define "splitspec.flagData" -}}
{{- range . }}
{{- if ne (kindOf .value) "bool" }}
{{ printf "SPLITSPEC_%s" .key }}: {{ .value | toString | quote }}
{{- end }}
{{- end }}
{{- end }}

{{- define "splitspec.flagArgs" -}}
{{- range . }}
{{- if eq (kindOf .value) "bool" }}
- {{ printf "--%s%s" (ternary "" "no-" .value) .flag | quote }}
{{- else }}
- {{ printf "--%s=$(SPLITSPEC_%s)" .flag .key | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* The chart's own flags per component, from the values they must agree with. */}}

{{- define "splitspec.gatewayFlags" -}}
{{- $g := .Values.gateway }}
{{- $own := list (dict "flag" "host" "key" "HOST" "value" "0.0.0.0") (dict "flag" "http-port" "key" "HTTP_PORT" "value" (int $g.httpPort)) (dict "flag" "grpc-port" "key" "GRPC_PORT" "value" (int $g.grpcPort)) }}
{{- $verifier := include "splitspec.componentName" (dict "root" . "component" "verifier") }}
{{- range $i := until (int .Values.verifier.replicas) }}
{{- $own = append $own (dict "flag" "verifier" "key" (printf "VERIFIER_%d" $i) "value" (printf "%s-%d.%s:%d" $verifier $i $verifier (int $.Values.verifier.port))) }}
{{- end }}
{{- if .Values.metrics.enabled }}
{{- $own = append $own (dict "flag" "metrics-port" "key" "METRICS_PORT" "value" (int .Values.metrics.ports.gateway)) }}
{{- end }}
{{- $own = concat $own (include "splitspec.tlsFlags" (dict "root" . "serve" .Values.tls.frontDoor "peer" "") | fromYamlArray) }}
{{- include "splitspec.flags" (dict "own" $own "user" $g.flags "where" "gateway.flags") }}
{{- end }}

{{- define "splitspec.verifierFlags" -}}
{{- $v := .Values.verifier }}
{{- $device := include "splitspec.device" (dict "root" . "device" $v.device) }}
{{- $own := list (dict "flag" "host" "key" "HOST" "value" "0.0.0.0") (dict "flag" "port" "key" "PORT" "value" (int $v.port)) (dict "flag" "model" "key" "MODEL" "value" (printf "%s/%s" .Values.models.path $v.model)) (dict "flag" "device" "key" "DEVICE" "value" (get .Values.devices $device).flag) (dict "flag" "dtype" "key" "DTYPE" "value" $v.dtype) }}
{{- range $method, $pool := .Values.proposers }}
{{- if $pool.enabled }}
{{- $name := include "splitspec.componentName" (dict "root" $ "component" (printf "proposer-%s" $method)) }}
{{- $own = append $own (dict "flag" "proposer" "key" (printf "PROPOSER_%s" ($method | upper)) "value" (printf "%s=%s:%d" $method $name (int $pool.port))) }}
{{- end }}
{{- end }}
{{- if gt (int $v.tensorParallelSize) 1 }}
{{- $own = append $own (dict "flag" "tensor-parallel-size" "key" "TENSOR_PARALLEL_SIZE" "value" (int $v.tensorParallelSize)) }}
{{- end }}
{{- if $v.leaderWorkerSet.enabled }}
{{- $own = append $own (dict "flag" "tensor-parallel-nodes" "key" "TENSOR_PARALLEL_NODES" "value" (int $v.leaderWorkerSet.hosts)) }}
{{- end }}
{{- $own = append $own (dict "flag" "shutdown-grace-s" "key" "SHUTDOWN_GRACE_S" "value" (int $v.shutdownGraceSeconds)) }}
{{- if .Values.metrics.enabled }}
{{- $own = append $own (dict "flag" "metrics-port" "key" "METRICS_PORT" "value" (int .Values.metrics.ports.verifier)) }}
{{- end }}
{{- $own = concat $own (include "splitspec.tlsFlags" (dict "root" . "serve" true "peer" (include "splitspec.componentName" (dict "root" . "component" "gateway"))) | fromYamlArray) }}
{{- include "splitspec.flags" (dict "own" $own "user" $v.flags "where" "verifier.flags") }}
{{- end }}

{{/* (dict "root" $ "method" "ngram" "pool" .Values.proposers.ngram) */}}
{{- define "splitspec.proposerFlags" -}}
{{- $root := .root }}
{{- $p := .pool }}
{{- $device := include "splitspec.device" (dict "root" $root "device" $p.device) }}
{{- $own := list (dict "flag" "method" "key" "METHOD" "value" .method) (dict "flag" "host" "key" "HOST" "value" "0.0.0.0") (dict "flag" "port" "key" "PORT" "value" (int $p.port)) (dict "flag" "device" "key" "DEVICE" "value" (get $root.Values.devices $device).flag) }}
{{- if $p.model }}
{{- $own = append $own (dict "flag" "model" "key" "MODEL" "value" (printf "%s/%s" $root.Values.models.path $p.model)) }}
{{- end }}
{{- if $p.tokenizer }}
{{- $own = append $own (dict "flag" "tokenizer" "key" "TOKENIZER" "value" (printf "%s/%s" $root.Values.models.path $p.tokenizer)) }}
{{- end }}
{{- if $root.Values.metrics.enabled }}
{{- $own = append $own (dict "flag" "metrics-port" "key" "METRICS_PORT" "value" (int $root.Values.metrics.ports.proposer)) }}
{{- end }}
{{- $own = concat $own (include "splitspec.tlsFlags" (dict "root" $root "serve" true "peer" (include "splitspec.componentName" (dict "root" $root "component" "verifier"))) | fromYamlArray) }}
{{- include "splitspec.flags" (dict "own" $own "user" $p.flags "where" (printf "proposers.%s.flags" .method)) }}
{{- end }}

{{/* TLS (docs/deploy.md#tls). A role's secret: (dict "root" $ "role" "verifier") */}}
{{- define "splitspec.tlsSecret" -}}
{{- default (printf "%s-%s-tls" (include "splitspec.fullname" .root) .role) (get .root.Values.tls.secrets .role) }}
{{- end }}

{{/* The chart's TLS flags of a component, from its role's mounted secret: (dict "root" $
"serve" whether it serves TLS (else it only dials with its certificate) "peer" the identity
allowed to call it, "" for any) */}}
{{- define "splitspec.tlsFlags" -}}
{{- $t := .root.Values.tls }}
{{- $out := list }}
{{- if $t.enabled }}
{{- $cert := ternary "tls-cert" "tls-client-cert" .serve }}
{{- $key := ternary "tls-key" "tls-client-key" .serve }}
{{- $out = append $out (dict "flag" $cert "key" ($cert | upper | replace "-" "_") "value" (printf "%s/tls.crt" $t.mountPath)) }}
{{- $out = append $out (dict "flag" $key "key" ($key | upper | replace "-" "_") "value" (printf "%s/tls.key" $t.mountPath)) }}
{{- $out = append $out (dict "flag" "tls-ca" "key" "TLS_CA" "value" (printf "%s/ca.crt" $t.mountPath)) }}
{{- if and $t.restrictPeers .peer }}
{{- $out = append $out (dict "flag" "tls-allow-peer" "key" "TLS_ALLOW_PEER" "value" .peer) }}
{{- end }}
{{- end }}
{{- toYaml $out }}
{{- end }}
