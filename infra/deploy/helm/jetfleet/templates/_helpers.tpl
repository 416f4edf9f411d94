{{/* Names ------------------------------------------------------------------------------- */}}

{{- define "jetfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The objects' name prefix: the release name, plus the chart's name unless it holds it. */}}
{{- define "jetfleet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "jetfleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels: (dict "root" $ "component" NAME) --------------------------------------------- */}}

{{- define "jetfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "jetfleet.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "jetfleet.labels" -}}
helm.sh/chart: {{ include "jetfleet.chart" .root }}
{{ include "jetfleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: jetfleet
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Images ------------------------------------------------------------------------------ */}}

{{/* The jetfleet image; (dict "root" $ "override" MAP) lets a pool name its own. */}}
{{- define "jetfleet.image" -}}
{{- $img := mergeOverwrite (deepCopy .root.Values.image) (default dict .override) }}
{{- printf "%s:%s" $img.repository (toString (default .root.Chart.AppVersion $img.tag)) }}
{{- end }}

{{- define "jetfleet.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Connections --------------------------------------------------------------------------- */}}

{{- define "jetfleet.connectionsSecret" -}}
{{ include "jetfleet.fullname" . }}-connections
{{- end }}

{{- define "jetfleet.natsHost" -}}
{{ include "jetfleet.fullname" . }}-nats
{{- end }}

{{- define "jetfleet.redisHost" -}}
{{ include "jetfleet.fullname" . }}-redis
{{- end }}

{{- define "jetfleet.sentinelHost" -}}
{{ include "jetfleet.fullname" . }}-redis-sentinel
{{- end }}

{{- define "jetfleet.natsPasswordSecret" -}}
{{- default (printf "%s-nats-auth" (include "jetfleet.fullname" .)) .Values.nats.auth.existingSecret }}
{{- end }}

{{- define "jetfleet.redisPasswordSecret" -}}
{{- default (printf "%s-redis-auth" (include "jetfleet.fullname" .)) .Values.redis.auth.existingSecret }}
{{- end }}

{{/* Whether the chart keeps an external URL in its connections Secret. */}}
{{- define "jetfleet.needsConnectionsSecret" -}}
{{- if or (and (not .Values.nats.enabled) (not .Values.nats.existingSecret)) (and (not .Values.redis.enabled) (not .Values.redis.existingSecret)) }}true{{ end }}
{{- end }}

{{/* JETFLEET_NATS_URL (and the NATS credentials) of a jetfleet container. */}}
{{- define "jetfleet.natsEnv" -}}
{{- $nats := .Values.nats }}
{{- if $nats.enabled }}
{{- if $nats.auth.enabled }}
- name: JETFLEET_NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "jetfleet.natsPasswordSecret" . }}
      key: {{ $nats.auth.existingSecretKey }}
- name: JETFLEET_NATS_URL
  value: {{ printf "nats://%s:$(JETFLEET_NATS_PASSWORD)@%s:4222" $nats.auth.user (include "jetfleet.natsHost" .) | quote }}
{{- else }}
- name: JETFLEET_NATS_URL
  value: {{ printf "nats://%s:4222" (include "jetfleet.natsHost" .) | quote }}
{{- end }}
{{- else }}
{{- if not (or $nats.url $nats.existingSecret) }}
{{- fail "nats.enabled is false: set nats.url (or nats.existingSecret) to the NATS of the fleet" }}
{{- end }}
- name: JETFLEET_NATS_URL
  valueFrom:
    secretKeyRef:
      name: {{ default (include "jetfleet.connectionsSecret" .) $nats.existingSecret }}
      key: {{ ternary $nats.existingSecretKey "nats-url" (not (empty $nats.existingSecret)) }}
{{- end }}
{{- if $nats.credsSecret }}
- name: JETFLEET_NATS_CREDS
  value: /etc/jetfleet/nats-creds/nats.creds
{{- end }}
{{- if $nats.tlsSecret }}
- name: JETFLEET_NATS_TLS_CA
  value: /etc/jetfleet/nats-tls/ca.crt
{{- end }}
{{- end }}

{{/* JETFLEET_REDIS_URL of a jetfleet container that uses Redis. */}}
{{- define "jetfleet.redisEnv" -}}
{{- $redis := .Values.redis }}
{{- if $redis.enabled }}
{{- $auth := "" }}
{{- if $redis.auth.enabled }}
{{- $auth = ":$(JETFLEET_REDIS_PASSWORD)@" }}
- name: JETFLEET_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "jetfleet.redisPasswordSecret" . }}
      key: {{ $redis.auth.existingSecretKey }}
{{- end }}
- name: JETFLEET_REDIS_URL
{{- if $redis.sentinel.enabled }}
  value: {{ printf "redis+sentinel://%s%s:26379/%s/%d" $auth (include "jetfleet.sentinelHost" .) $redis.sentinel.masterSet (int $redis.db) | quote }}
{{- else }}
  value: {{ printf "redis://%s%s:6379/%d" $auth (include "jetfleet.redisHost" .) (int $redis.db) | quote }}
{{- end }}
{{- else }}
{{- if not (or $redis.url $redis.existingSecret) }}
{{- fail "redis.enabled is false: set redis.url (or redis.existingSecret) to the Redis of the fleet" }}
{{- end }}
- name: JETFLEET_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ default (include "jetfleet.connectionsSecret" .) $redis.existingSecret }}
      key: {{ ternary $redis.existingSecretKey "redis-url" (not (empty $redis.existingSecret)) }}
{{- if $redis.sentinelPasswordSecret }}
- name: JETFLEET_SENTINEL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $redis.sentinelPasswordSecret }}
      key: sentinel-password
{{- end }}
{{- end }}
{{- end }}

{{/* The NATS credential volumes and mounts of a jetfleet pod. */}}
{{- define "jetfleet.natsVolumes" -}}
{{- with .Values.nats.credsSecret }}
- name: nats-creds
  secret:
    secretName: {{ . }}
{{- end }}
{{- with .Values.nats.tlsSecret }}
- name: nats-tls
  secret:
    secretName: {{ . }}
{{- end }}
{{- end }}

{{- define "jetfleet.natsVolumeMounts" -}}
{{- if .Values.nats.credsSecret }}
- name: nats-creds
  mountPath: /etc/jetfleet/nats-creds
  readOnly: true
{{- end }}
{{- if .Values.nats.tlsSecret }}
- name: nats-tls
  mountPath: /etc/jetfleet/nats-tls
  readOnly: true
{{- end }}
{{- end }}

{{/* A jetfleet container's environment: (dict "root" $ "redis" BOOL "extra" LIST). */}}
{{- define "jetfleet.env" -}}
- name: HOME  # the root filesystem is read-only: caches go to the /tmp emptyDir
  value: /tmp
- name: JETFLEET_LOG_LEVEL
  value: {{ .root.Values.fleet.logLevel | quote }}
{{ include "jetfleet.natsEnv" .root }}
{{- if .redis }}
{{ include "jetfleet.redisEnv" .root }}
{{- end }}
{{- with .root.Values.fleet.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- with .extra }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Flags every jetfleet command takes. */}}
{{- define "jetfleet.commonArgs" -}}
{{- toJson (list "--subject-prefix" .Values.fleet.subjectPrefix "--log-format" .Values.fleet.logFormat) }}
{{- end }}

{{/* The operations port's flags. */}}
{{- define "jetfleet.opsArgs" -}}
{{- toJson (list "--metrics-port" (toString .) "--metrics-host" "0.0.0.0") }}
{{- end }}

{{/* Probes on the `ops` port: liveness /health, readiness /ready. */}}
{{- define "jetfleet.opsProbes" -}}
readinessProbe:
  httpGet:
    path: /ready
    port: ops
  periodSeconds: 5
livenessProbe:
  httpGet:
    path: /health
    port: ops
  periodSeconds: 10
  failureThreshold: 6
{{- end }}

{{/* The pod-level settings of a jetfleet pod: (dict "root" $ "values" COMPONENT-VALUES). */}}
{{- define "jetfleet.podPlacement" -}}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* /tmp of a jetfleet pod (volumes) and container (mounts). */}}
{{- define "jetfleet.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.tmpSizeLimit }}
{{- end }}

{{- define "jetfleet.tmpMount" -}}
- name: tmp
  mountPath: /tmp
{{- end }}

{{/* A PodDisruptionBudget: (dict "root" $ "name" NAME "component" C "pdb" VALUES "match" MAP). */}}
{{- define "jetfleet.pdb" -}}
{{- if .pdb.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ .name }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "jetfleet.labels" . | nindent 4 }}
spec:
  maxUnavailable: {{ .pdb.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "jetfleet.selectorLabels" . | nindent 6 }}
      {{- with .match }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
{{- end }}
{{- end }}

{{/* Workers ---------------------------------------------------------------------------------- */}}

{{/* The pools, each merged over workers.poolDefaults, as a JSON list. */}}
{{- define "jetfleet.pools" -}}
{{- $pools := list }}
{{- $roles := dict }}
{{- range .Values.workers.pools }}
{{- $pool := mergeOverwrite (deepCopy $.Values.workers.poolDefaults) (deepCopy .) }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" (toString $pool.name)) }}
{{- fail (printf "workers.pools: %q is not a DNS label (lowercase letters, digits, '-')" (toString $pool.name)) }}
{{- end }}
{{- if not (has $pool.role (list "agg" "prefill" "decode")) }}
{{- fail (printf "workers.pools[%s].role: %q is none of agg, prefill, decode" $pool.name (toString $pool.role)) }}
{{- end }}
{{- if not (has $pool.engine (list "mocker" "vllm")) }}
{{- fail (printf "workers.pools[%s].engine: %q is neither mocker nor vllm" $pool.name (toString $pool.engine)) }}
{{- end }}
{{- if hasKey $roles $pool.role }}
{{- fail (printf "workers.pools: roles %s twice (%s, %s): the planner and the connector scale one Deployment per role" $pool.role (get $roles $pool.role) $pool.name) }}
{{- end }}
{{- if le (int $pool.terminationGracePeriodSeconds) (int $pool.drainTimeoutSeconds) }}
{{- fail (printf "workers.pools[%s]: terminationGracePeriodSeconds (%v) must exceed drainTimeoutSeconds (%v), or the kubelet kills draining workers" $pool.name $pool.terminationGracePeriodSeconds $pool.drainTimeoutSeconds) }}
{{- end }}
{{- $_ := set $roles $pool.role $pool.name }}
{{- $pools = append $pools $pool }}
{{- end }}
{{- toJson $pools }}
{{- end }}

{{- define "jetfleet.poolName" -}}
{{ include "jetfleet.fullname" .root }}-worker-{{ .pool.name }}
{{- end }}

{{/* A jetfleet Deployment. Parameters:
     root, component, values (the component's values: resources, placement, podAnnotations,
     terminationGracePeriodSeconds, extraEnv), args (list), and optionally: name, labels (map,
     also in the selector), replicas (omitted: none in the spec), strategy, image (override map),
     port (the `ops` port; none: no ports, no probes), probes (YAML; default: jetfleet.opsProbes),
     preStopSleepSeconds, redis (bool: JETFLEET_REDIS_URL), serviceAccountName, volumes, mounts,
     env (lists). */}}
{{- define "jetfleet.deployment" -}}
{{- $root := .root }}
{{- $v := .values }}
{{- $sel := dict "root" $root "component" .component }}
{{- $name := default (printf "%s-%s" (include "jetfleet.fullname" $root) .component) .name }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "jetfleet.labels" $sel | nindent 4 }}
    {{- with .labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  {{- if hasKey . "replicas" }}
  replicas: {{ .replicas }}
  {{- end }}
  {{- with .strategy }}
  strategy:
    type: {{ . }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "jetfleet.selectorLabels" $sel | nindent 6 }}
      {{- with .labels }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
  template:
    metadata:
      labels:
        {{- include "jetfleet.labels" $sel | nindent 8 }}
        {{- with .labels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $v.podAnnotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      {{- if .serviceAccountName }}
      serviceAccountName: {{ .serviceAccountName }}
      automountServiceAccountToken: true
      {{- else }}
      automountServiceAccountToken: false  # it never calls the Kubernetes API
      {{- end }}
      terminationGracePeriodSeconds: {{ $v.terminationGracePeriodSeconds }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      {{- include "jetfleet.imagePullSecrets" $root | nindent 6 }}
      {{- include "jetfleet.podPlacement" (dict "values" $v) | nindent 6 }}
      containers:
        - name: {{ .component }}
          image: {{ include "jetfleet.image" (dict "root" $root "override" .image) }}
          imagePullPolicy: {{ (mergeOverwrite (deepCopy $root.Values.image) (default dict .image)).pullPolicy }}
          command: ["jetfleet"]
          args:
            {{- toYaml .args | nindent 12 }}
          env:
            {{- include "jetfleet.env" (dict "root" $root "redis" .redis "extra" (concat (default list .env) (default list $v.extraEnv))) | nindent 12 }}
          {{- if .port }}
          ports:
            - name: ops
              containerPort: {{ .port }}
          {{- default (include "jetfleet.opsProbes" .) .probes | nindent 10 }}
          {{- end }}
          {{- if gt (int (default 0 .preStopSleepSeconds)) 0 }}
          lifecycle:
            preStop:  # endpoints drop the pod before it stops accepting connections
              exec:
                command: ["sleep", {{ .preStopSleepSeconds | quote }}]
          {{- end }}
          resources:
            {{- toYaml $v.resources | nindent 12 }}
          securityContext:
            {{- toYaml $root.Values.containerSecurityContext | nindent 12 }}
          volumeMounts:
            {{- include "jetfleet.tmpMount" $root | nindent 12 }}
            {{- include "jetfleet.natsVolumeMounts" $root | nindent 12 }}
            {{- with .mounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
      volumes:
        {{- include "jetfleet.tmpVolume" $root | nindent 8 }}
        {{- include "jetfleet.natsVolumes" $root | nindent 8 }}
        {{- with .volumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
{{- end }}
