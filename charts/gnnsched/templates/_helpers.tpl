{{/* Names, labels and shared snippets. */}}

{{- define "gnnsched.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gnnsched.fullname" -}}
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

{{/* A component's object name: <fullname>-<component>, kept within 63 characters. */}}
{{- define "gnnsched.component" -}}
{{- printf "%s-%s" (include "gnnsched.fullname" .root | trunc (int (sub 62 (len .component))) | trimSuffix "-") .component }}
{{- end }}

{{- define "gnnsched.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "gnnsched.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "gnnsched.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gnnsched.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gnnsched.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Hardened container security context for everything that needs no host access. */}}
{{- define "gnnsched.restrictedContainerSecurity" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "gnnsched.restrictedPodSecurity" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Name prefix of the queue PriorityClasses: queuePriority.prefix, or "<fullname>-runtime-" (cluster-scoped
objects: two releases must not collide). The operator gets the same prefix as a flag. */}}
{{- define "gnnsched.queuePriorityPrefix" -}}
{{- .Values.queuePriority.prefix | default (printf "%s-runtime-" (include "gnnsched.fullname" .)) -}}
{{- end }}

{{/* The oldest Kubernetes the chart supports: kube-scheduler's profile-level percentageOfNodesToScore needs 1.27,
and 1.30 is the oldest version the chart is rendered and schema-checked against in CI (tests/test_chart.py). */}}
{{- define "gnnsched.minKubeVersion" -}}1.30.0{{- end }}

{{/* Fails the render on a cluster older than the minimum, naming it (Helm's own Chart.yaml kubeVersion check runs on
install and upgrade only, not on every render path). */}}
{{- define "gnnsched.checkKubeVersion" -}}
{{- $min := include "gnnsched.minKubeVersion" . -}}
{{- if not (semverCompare (printf ">=%s-0" $min) .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "gnnsched needs Kubernetes v%s or newer (this cluster is %s)" $min .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- end }}

{{/* kube-scheduler's tag: scheduler.image.tag, or the cluster's own version without the vendor suffix
(v1.31.4-gke.100 -> v1.31.4), since kube-scheduler may not be newer than the API server (version-skew policy) and
registry.k8s.io publishes a tag for every upstream patch release. */}}
{{- define "gnnsched.schedulerTag" -}}
{{- if .Values.scheduler.image.tag -}}
{{- .Values.scheduler.image.tag -}}
{{- else -}}
{{- printf "v%s" (regexFind "^[0-9]+\\.[0-9]+\\.[0-9]+" (trimPrefix "v" .Capabilities.KubeVersion.Version)) -}}
{{- end -}}
{{- end }}

{{/* --bind-timeout for the extender: 80 % of kube-scheduler's httpTimeout for it (ms, s or m), in seconds, so the
extender always answers bind before the scheduler gives up on the call. */}}
{{- define "gnnsched.bindTimeout" -}}
{{- $t := .Values.scheduler.extender.httpTimeout -}}
{{- $n := regexFind "^[0-9]+" $t | float64 -}}
{{- if hasSuffix "ms" $t -}}
{{- $n = divf $n 1000 -}}
{{- else if hasSuffix "m" $t -}}
{{- $n = mulf $n 60 -}}
{{- end -}}
{{- mulf $n 0.8 -}}
{{- end }}

{{/* The RuntimeClass of job pods: jobs.runtimeClassName, or the node DaemonSet's (both need the GPU runtime). */}}
{{- define "gnnsched.jobsRuntimeClass" -}}
{{- .Values.jobs.runtimeClassName | default .Values.node.runtimeClassName -}}
{{- end }}

{{/* The ConfigMap the runtime model in use is kept in (the retrain CronJob writes it, the operator re-reads it). */}}
{{- define "gnnsched.predictorModel" -}}
{{- include "gnnsched.component" (dict "root" . "component" "predictor-model") }}
{{- end }}

{{/* The retrain CronJob's name: at most 52 characters, the limit of a CronJob's name (its Jobs add a suffix). */}}
{{- define "gnnsched.retrainName" -}}
{{- printf "%s-retrain" (include "gnnsched.fullname" . | trunc 44 | trimSuffix "-") }}
{{- end }}
