{{- define "krypton.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "krypton.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "krypton.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "krypton.serviceAccountName" -}}
{{- default (include "krypton.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "krypton.discoveryNamespace" -}}
{{- default .Release.Namespace .Values.discovery.namespace -}}
{{- end -}}

{{- define "krypton.profileNamespace" -}}
{{- default (include "krypton.discoveryNamespace" .) .Values.clusterProfiles.namespace -}}
{{- end -}}

{{- define "krypton.leaseNamespace" -}}
{{- default (default .Release.Namespace .Values.leaderElection.namespace) .Values.watchNamespace -}}
{{- end -}}
