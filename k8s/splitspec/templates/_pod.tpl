{{/* The pod template every workload uses. Parameters (dict):
  root        the chart's root context ($)
  component   gateway | verifier | proposer
  method      proposer method, or ""
  name        the component's object name (ConfigMap, container)
  command     the console script (pyproject.toml [project.scripts])
  flags       the component's flag list (splitspec.*Flags | fromYamlArray)
  device      cpu | cuda | mlu          count: accelerators per pod
  resources   requests/limits           models: whether the model volume is mounted
  ports       list of {name, port}      metricsPort: 0 for none
  tlsRole     gateway | verifier | proposer: the secret mounted when tls.enabled
  probes      YAML of the probes        grace: terminationGracePeriodSeconds
  preStop     seconds of preStop sleep  placement: {nodeSelector, tolerations, affinity}
  light       (optional) true for a CPU-trivial component: one torch thread (splitspec.threads)
  extraArgs   (optional) literal args after the flags, expanded by the kubelet from variables
              the pod gets at run time (a LeaderWorkerSet's LWS_*)
  shm         (optional) size of a memory-backed /dev/shm (tensor parallelism's collectives) */}}
{{- define "splitspec.podTemplate" -}}
{{- $root := .root }}
{{- $v := $root.Values -}}
metadata:
  labels:
    {{- include "splitspec.labels" (dict "root" $root "component" .component "method" .method) | nindent 4 }}
    {{- with $v.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    checksum/flags: {{ include "splitspec.flagData" .flags | sha256sum }}
    {{- if and $v.metrics.enabled .metricsPort }}
    prometheus.io/scrape: "true"
    prometheus.io/port: {{ .metricsPort | quote }}
    prometheus.io/path: /metrics
    {{- end }}
    {{- with $v.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "splitspec.serviceAccountName" $root }}
  automountServiceAccountToken: false
  enableServiceLinks: false
  {{- with $v.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $v.podSecurityContext | nindent 4 }}
  terminationGracePeriodSeconds: {{ int .grace }}
  {{- if and .models (eq $v.models.source "image") }}
  initContainers:
    - name: copy-models
      image: {{ printf "%s:%s" $v.models.image.repository (default $root.Chart.AppVersion $v.models.image.tag) | quote }}
      imagePullPolicy: {{ $v.image.pullPolicy }}
      command: ["cp", "-R", "{{ $v.models.image.sourcePath }}/.", "/models-volume/"]
      securityContext:
        {{- toYaml $v.securityContext | nindent 8 }}
      resources:
        requests: {cpu: 100m, memory: 64Mi}
        limits: {cpu: 500m, memory: 128Mi}
      volumeMounts:
        - name: models
          mountPath: /models-volume
  {{- end }}
  containers:
    - name: {{ .component }}
      image: {{ include "splitspec.image" (dict "root" $root "device" .device) | quote }}
      imagePullPolicy: {{ $v.image.pullPolicy }}
      command: [{{ .command | quote }}]
      args:
        {{- include "splitspec.flagArgs" .flags | trim | nindent 8 }}
        {{- range .extraArgs }}
        - {{ . | quote }}
        {{- end }}
      envFrom:
        - configMapRef:
            name: {{ .name }}
      env:
        - name: POD_NAME
          valueFrom: {fieldRef: {fieldPath: metadata.name}}
        - name: POD_NAMESPACE
          valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
        - name: HOME
          value: /tmp
        {{- with include "splitspec.threads" (dict "resources" .resources "light" .light) }}
        - name: OMP_NUM_THREADS
          value: {{ . | quote }}
        {{- end }}
        {{- if $v.otel.enabled }}
        - name: OTEL_EXPORTER_OTLP_ENDPOINT
          value: {{ $v.otel.endpoint | quote }}
        - name: OTEL_EXPORTER_OTLP_PROTOCOL
          value: {{ $v.otel.protocol | quote }}
        - name: OTEL_SERVICE_NAME
          value: {{ printf "splitspec-%s" (ternary (printf "proposer-%s" .method) .component (ne .method "")) | quote }}
        - name: OTEL_TRACES_SAMPLER
          value: {{ $v.otel.sampler | quote }}
        - name: OTEL_TRACES_SAMPLER_ARG
          value: {{ $v.otel.samplerArg | quote }}
        {{- $attrs := list "k8s.pod.name=$(POD_NAME)" "k8s.namespace.name=$(POD_NAMESPACE)" (printf "service.namespace=%s" $root.Release.Name) }}
        {{- range $k, $val := $v.otel.resourceAttributes }}
        {{- $attrs = append $attrs (printf "%s=%s" $k $val) }}
        {{- end }}
        - name: OTEL_RESOURCE_ATTRIBUTES
          value: {{ join "," $attrs | quote }}
        {{- end }}
      {{- if or .ports (and $v.metrics.enabled .metricsPort) }}
      ports:
        {{- range .ports }}
        - name: {{ .name }}
          containerPort: {{ int .port }}
          protocol: TCP
        {{- end }}
        {{- if and $v.metrics.enabled .metricsPort }}
        - name: metrics
          containerPort: {{ int .metricsPort }}
          protocol: TCP
        {{- end }}
      {{- end }}
      {{- with .probes }}
      {{- . | nindent 6 }}
      {{- end }}
      lifecycle:
        preStop:
          exec:
            command: ["sleep", {{ .preStop | toString | quote }}]
      resources:
        {{- include "splitspec.resources" (dict "root" $root "device" .device "count" .count "resources" .resources) | nindent 8 }}
      securityContext:
        {{- toYaml $v.securityContext | nindent 8 }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
        {{- if .shm }}
        - name: dshm
          mountPath: /dev/shm
        {{- end }}
        {{- if .models }}
        - name: models
          mountPath: {{ $v.models.path }}
          readOnly: true
        {{- end }}
        {{- if $v.tls.enabled }}
        - name: tls
          mountPath: {{ $v.tls.mountPath }}
          readOnly: true
        {{- end }}
  volumes:
    - name: tmp
      emptyDir:
        sizeLimit: {{ $v.tmpSizeLimit }}
    {{- if $v.tls.enabled }}
    - name: tls
      secret:
        secretName: {{ include "splitspec.tlsSecret" (dict "root" $root "role" .tlsRole) }}
        defaultMode: 0440
    {{- end }}
    {{- if .shm }}
    - name: dshm
      emptyDir:
        medium: Memory
        sizeLimit: {{ .shm }}
    {{- end }}
    {{- if .models }}
    - name: models
      {{- if eq $v.models.source "pvc" }}
      persistentVolumeClaim:
        claimName: {{ required "models.pvc.claimName is required when models.source is pvc" $v.models.pvc.claimName }}
        readOnly: true
      {{- else }}
      emptyDir:
        sizeLimit: {{ $v.models.image.sizeLimit }}
      {{- end }}
    {{- end }}
  {{- with .placement.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .placement.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .placement.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/* Probes against grpc.health.v1 (SERVING only once the model is loaded and warmed up):
(dict "root" $ "port" 50051 "serverName" the name the service's certificate holds "startup"
{periodSeconds, failureThreshold}). Native gRPC probes speak plaintext only; with tls.enabled
the port requires a client certificate, so `splitspec-health` checks it from inside the pod,
presenting the pod's own certificate. */}}
{{- define "splitspec.grpcProbes" -}}
{{- $check := include "splitspec.healthCheck" . | trim }}
{{- $slow := ternary 3 0 .root.Values.tls.enabled -}}
startupProbe:
  {{- $check | nindent 2 }}
  periodSeconds: {{ int .startup.periodSeconds }}
  failureThreshold: {{ int .startup.failureThreshold }}
  timeoutSeconds: {{ add 2 $slow }}
readinessProbe:
  {{- $check | nindent 2 }}
  periodSeconds: 5
  failureThreshold: 2
  timeoutSeconds: {{ add 2 $slow }}
livenessProbe:
  {{- $check | nindent 2 }}
  periodSeconds: 10
  failureThreshold: 6
  timeoutSeconds: 5
{{- end }}

{{/* One health check of a gRPC port: native, or `splitspec-health` over mutual TLS:
(dict "root" $ "port" 50051 "serverName" "...") */}}
{{- define "splitspec.healthCheck" -}}
{{- $t := .root.Values.tls }}
{{- if $t.enabled }}
exec:
  command: ["splitspec-health", "--port", {{ int .port | toString | quote }}, "--tls-ca", {{ printf "%s/ca.crt" $t.mountPath | quote }}, "--tls-cert", {{ printf "%s/tls.crt" $t.mountPath | quote }}, "--tls-key", {{ printf "%s/tls.key" $t.mountPath | quote }}, "--server-name", {{ .serverName | quote }}]
{{- else }}
grpc: {port: {{ int .port }}}
{{- end }}
{{- end }}
