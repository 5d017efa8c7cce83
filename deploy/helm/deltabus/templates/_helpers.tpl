{{/* Names: <release>-deltabus unless the release name holds the chart's name. */}}
{{- define "deltabus.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "deltabus.fullname" -}}
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

{{- define "deltabus.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "deltabus.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "etl") */}}
{{- define "deltabus.selectorLabels" -}}
app.kubernetes.io/name: {{ include "deltabus.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "deltabus.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "deltabus.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "deltabus.configMapName" -}}
{{- printf "%s-lake" (include "deltabus.fullname" .) -}}
{{- end -}}

{{/* image: (list $ .Values.image) -> repository:tag, the tag defaulting to appVersion. */}}
{{- define "deltabus.image" -}}
{{- $root := index . 0 -}}
{{- $image := index . 1 -}}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) -}}
{{- end -}}

{{/* The lake's settings and credentials, as a container's envFrom and env entries. */}}
{{- define "deltabus.lakeEnvFrom" -}}
- configMapRef:
    name: {{ include "deltabus.configMapName" . }}
{{- end -}}

{{- define "deltabus.credentialEnv" -}}
{{- if .Values.credentials.existingSecret }}
{{- range $variable, $key := .Values.credentials.keys }}
- name: {{ $variable }}
  valueFrom:
    secretKeyRef:
      name: {{ $.Values.credentials.existingSecret }}
      key: {{ $key }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
A bus component's Deployment: (dict "root" $ "component" "etl" "values" .Values.etl
"args" (list ...) "env" (list ...)). Runs `deltabus ARGS` from the bus image with the lake's
ConfigMap, the credentials, the health port and its probes.
*/}}
{{- define "deltabus.busDeployment" -}}
{{- $root := .root -}}
{{- $v := .values -}}
{{- $labels := dict "root" $root "component" .component -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "deltabus.fullname" $root }}-{{ .component }}
  labels:
    {{- include "deltabus.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  replicas: {{ $v.replicas }}
  selector:
    matchLabels:
      {{- include "deltabus.selectorLabels" $labels | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "deltabus.selectorLabels" $labels | nindent 8 }}
      annotations:
        checksum/lake: {{ include (print $root.Template.BasePath "/configmap.yaml") $root | sha256sum }}
        {{- with $root.Values.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ include "deltabus.serviceAccountName" $root }}
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: {{ $v.terminationGracePeriodSeconds }}
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      containers:
        - name: {{ .component }}
          image: {{ include "deltabus.image" (list $root $root.Values.image) | quote }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          args:
            {{- range .args }}
            - {{ . | quote }}
            {{- end }}
          ports:
            - name: health
              containerPort: {{ $root.Values.healthPort }}
              protocol: TCP
          envFrom:
            {{- include "deltabus.lakeEnvFrom" $root | nindent 12 }}
          env:
            - name: DELTABUS_HEALTH_PORT
              value: {{ $root.Values.healthPort | quote }}
            # The root filesystem is read-only: caches and temporary files go to /tmp.
            - name: HOME
              value: /tmp
            {{- with include "deltabus.credentialEnv" $root }}
            {{- . | trim | nindent 12 }}
            {{- end }}
            {{- with .env }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
            {{- with $root.Values.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          startupProbe:
            {{- toYaml $root.Values.probes.startup | nindent 12 }}
          livenessProbe:
            {{- toYaml $root.Values.probes.liveness | nindent 12 }}
          readinessProbe:
            {{- toYaml $root.Values.probes.readiness | nindent 12 }}
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
          resources:
            {{- toYaml $v.resources | nindent 12 }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
      volumes:
        # The only writable place (HOME too).
        - name: tmp
          emptyDir: {}
      {{- with $root.Values.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $root.Values.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $root.Values.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end -}}

{{/* The bus Deployments that are on: a list of (dict "component" "values"). */}}
{{- define "deltabus.components" -}}
{{- $on := list -}}
{{- if .Values.producer.enabled }}{{ $on = append $on (dict "component" "producer" "values" .Values.producer) }}{{ end -}}
{{- if .Values.etl.enabled }}{{ $on = append $on (dict "component" "etl" "values" .Values.etl) }}{{ end -}}
{{- if .Values.sinks.postgres.enabled }}{{ $on = append $on (dict "component" "sink-postgres" "values" .Values.sinks.postgres) }}{{ end -}}
{{- if .Values.sinks.opensearch.enabled }}{{ $on = append $on (dict "component" "sink-opensearch" "values" .Values.sinks.opensearch) }}{{ end -}}
{{- toJson $on -}}
{{- end -}}

{{/* A number as a command-line argument: whole numbers without an exponent (3.1536e+07). */}}
{{- define "deltabus.num" -}}
{{- if eq (float64 .) (float64 (int64 .)) -}}{{ int64 . }}{{- else -}}{{ . }}{{- end -}}
{{- end -}}
