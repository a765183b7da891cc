{{- define "offtake.name" -}}
{{- default "offtake" .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- /* <release>-<name> (<release>-offtake) unless fullnameOverride. Room is left for the
longest suffix (-operator-cluster) within 63 characters. */ -}}
{{- define "offtake.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 46 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "offtake.name" .) | trunc 46 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "offtake.operatorName" -}}
{{- printf "%s-operator" (include "offtake.fullname" .) -}}
{{- end -}}

{{- /* Labels of every pipeline's ServiceMonitor: monitoring.serviceMonitor.labels and release. */ -}}
{{- define "offtake.serviceMonitorLabels" -}}
{{- $labels := deepCopy (.Values.monitoring.serviceMonitor.labels | default dict) -}}
{{- with .Values.monitoring.release -}}{{- $_ := set $labels "release" . -}}{{- end -}}
{{- toJson $labels -}}
{{- end -}}

{{- define "offtake.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "offtake.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "offtake.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The workers' images: worker.image / worker.sparkImage, else <repository>:<tag>. */}}
{{- define "offtake.workerImage" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- default (printf "%s:%s" .Values.worker.repository $tag) .Values.worker.image -}}
{{- end -}}

{{- define "offtake.workerSparkImage" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- $default := default (printf "%s:%s" .Values.worker.sparkRepository $tag) .Values.worker.image -}}
{{- default $default .Values.worker.sparkImage -}}
{{- end -}}

{{- define "offtake.peering" -}}
{{- if or .Values.peering.enabled (gt (int .Values.operator.replicas) 1) -}}
{{- .Values.peering.name -}}
{{- end -}}
{{- end -}}

{{- define "offtake.labels" -}}
app.kubernetes.io/name: {{ include "offtake.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "offtake.selectorLabels" -}}
app.kubernetes.io/name: {{ include "offtake.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "offtake.namespacedRules" -}}
{{- /*
What the operator does in a served namespace, verb by verb (docs/operator.md, "RBAC"). It
never PUTs (server-side apply is a patch; kopf patches), so no update but on finalizers.
*/}}
# The pipelines: watch them; kopf's finalizer and annotations are patches. Never delete.
- apiGroups: [offtake.dev]
  resources: [consumerpipelines]
  verbs: [get, list, watch, patch]
- apiGroups: [offtake.dev]
  resources: [consumerpipelines/status]
  verbs: [patch]
# Children carry blockOwnerDeletion: the OwnerReferencesPermissionEnforcement admission plugin
# requires update on the owner's finalizers for that.
- apiGroups: [offtake.dev]
  resources: [consumerpipelines/finalizers]
  verbs: [update]
# The children it creates and repairs (server-side apply: create + patch), watched by label.
# ConfigMaps and Services are never deleted by the operator (the garbage collector does).
- apiGroups: [""]
  resources: [configmaps, services]
  verbs: [get, list, watch, create, patch]
# Deleted when their switch goes (mode inject, autoscaling off, another redrive id), and only
# the ones carrying the pipeline's uid (a uid precondition on the delete).
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch, delete]
# spec.redrive runs as a Job.
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [get, create, patch, delete]
- apiGroups: [monitoring.coreos.com]
  resources: [servicemonitors, prometheusrules]
  verbs: [get, create, patch, delete]
- apiGroups: [keda.sh]
  resources: [scaledobjects, triggerauthentications]
  verbs: [get, create, patch, delete]
# The Kubeflow Spark operator's Spark Connect server of a pipeline with submit.mode kubernetes.
- apiGroups: [sparkoperator.k8s.io]
  resources: [sparkconnects]
  verbs: [get, create, patch, delete]
# ... its NetworkPolicies (the Connect port only from the pipeline's workers).
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create, patch, delete]
# mode inject: the pods that carry a pipeline's worker (status, and Events when it is deleted);
# queue mode: the workers whose /metrics give status.backlog (by pod IP).
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
# get: spec.kafka.secretRef, for the admin client that measures lag and rewinds (by name, never
# list or watch). create, patch, delete: only the Spark Connect token Secret the operator
# generates and owns (<pipeline>-spark-token); RBAC cannot name it in advance, and the code
# writes and deletes no other Secret (deletes carry the pipeline's uid as a precondition).
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create, patch, delete]
# Events on the transitions that matter (kopf posts core v1 Events).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end -}}
