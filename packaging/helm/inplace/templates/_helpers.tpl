{{/* The labels every object carries, as packaging/kubernetes sets them: name and component. */}}
{{- define "inplace.labels" -}}
{app.kubernetes.io/name: inplace, app.kubernetes.io/component: {{ . }}}
{{- end }}

{{/* The image both Deployments run. */}}
{{- define "inplace.image" -}}
{{ required "image.repository is required: the repository you pushed the controller image to, e.g. --set image.repository=registry.example.com/platform/inplace-controller (docs/usage/install-helm.md)" .Values.image.repository }}:{{ .Values.image.tag | default (printf "v%s" .Chart.AppVersion) }}
{{- end }}

{{/*
A manifest of packaging/kubernetes (linked into files/), with the release's namespace for
inplace-system: the objects that need no setting come from one place, so the chart and
kustomize cannot drift apart in them.
*/}}
{{- define "inplace.shipped" -}}
{{ $.root.Files.Get $.file | replace "inplace-system" $.root.Release.Namespace }}
{{- end }}

{{/* What both Deployments' pods and containers share: non-root, no privileges. */}}
{{- define "inplace.podSpec" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  seccompProfile: {type: RuntimeDefault}
{{- with .Values.imagePullSecrets }}
imagePullSecrets: {{ toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "inplace.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: {drop: [ALL]}
{{- end }}

{{- define "inplace.pullPolicy" -}}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end }}
