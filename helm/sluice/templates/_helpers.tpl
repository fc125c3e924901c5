{{/* The release's base name: "sluice" for a release of that name, else "<release>-sluice". */}}
{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels every object carries; the chart's own pods are never injected. */}}
{{- define "sluice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{ include "sluice.selector" . }}
{{- end -}}

{{- define "sluice.selector" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sluice.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "sluice.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* A tier's objects' name: (dict "root" $ "tier" "leaf"). */}}
{{- define "sluice.tierName" -}}
{{ include "sluice.fullname" .root }}-{{ .tier }}
{{- end -}}

{{/* host:port of a tier's gRPC Service. */}}
{{- define "sluice.tierAddress" -}}
{{ include "sluice.tierName" . }}.{{ .root.Release.Namespace }}.svc:{{ .root.Values.server.grpcPort }}
{{- end -}}

{{/* The tier the sidecars lease from. */}}
{{- define "sluice.sidecarTier" -}}
{{- .Values.sidecar.tier | default (last .Values.tiers).name -}}
{{- end -}}

{{/* The etcd endpoints the tiers elect through, comma-separated; empty: none. */}}
{{- define "sluice.etcdEndpoints" -}}
{{- if .Values.etcd.endpoints -}}
{{- join "," .Values.etcd.endpoints -}}
{{- else if .Values.etcd.trial.enabled -}}
http://{{ include "sluice.fullname" . }}-etcd.{{ .Release.Namespace }}.svc:2379
{{- end -}}
{{- end -}}

{{/*
The values checks that a JSON schema cannot express: the tree's shape, etcd for replicated tiers
and for configurations from etcd, one configuration source a tier, etcd TLS with https://
endpoints, gRPC probes on plaintext tiers only, rate limit files named apart from the tiers'
configurations in the configuration check, the sidecars' tier, and policies written by the chart
(identity.enabled) or by the tier's config, not both.
*/}}
{{- define "sluice.validate" -}}
{{- $seen := list -}}
{{- $etcd := include "sluice.etcdEndpoints" . -}}
{{- if and .Values.etcd.tls.secretName (not (hasPrefix "https://" $etcd)) -}}
{{- fail "etcd.tls.secretName: TLS toward etcd needs https:// etcd.endpoints" -}}
{{- end -}}
{{- if and $etcd (or .Values.etcd.tls.secretName .Values.etcd.auth.secretName) (not .Values.etcd.endpoints) -}}
{{- fail "etcd.tls and etcd.auth are for etcd.endpoints, not the trial etcd" -}}
{{- end -}}
{{- range $i, $tier := .Values.tiers -}}
{{- if eq (empty $tier.config) (empty $tier.configKey) -}}
{{- fail (printf "tiers[%d] (%s): set config or configKey, one of them" $i $tier.name) -}}
{{- end -}}
{{- if and $tier.configKey (not $etcd) -}}
{{- fail (printf "tiers[%d] (%s): configKey reads etcd: set etcd.endpoints or etcd.trial.enabled" $i $tier.name) -}}
{{- end -}}
{{- if has $tier.name $seen -}}
{{- fail (printf "tiers[%d]: the name %q is used twice" $i $tier.name) -}}
{{- end -}}
{{- if and (eq $i 0) $tier.parent -}}
{{- fail (printf "tiers[0] (%s) is the root: it has no parent" $tier.name) -}}
{{- end -}}
{{- if and (gt $i 0) (not (has $tier.parent $seen)) -}}
{{- fail (printf "tiers[%d] (%s): parent %q must name a tier listed before it" $i $tier.name ($tier.parent | default "")) -}}
{{- end -}}
{{- if and (gt (int ($tier.replicas | default 1)) 1) (not (include "sluice.etcdEndpoints" $)) -}}
{{- fail (printf "tiers[%d] (%s): %d replicas elect their master through etcd: set etcd.endpoints or etcd.trial.enabled" $i $tier.name (int $tier.replicas)) -}}
{{- end -}}
{{- $tls := include "sluice.tierTLS" (dict "root" $ "tier" $tier) | fromYaml -}}
{{- if and (eq $.Values.server.readinessProbe "grpc") $tls.secretName -}}
{{- fail (printf "tiers[%d] (%s): server.readinessProbe grpc needs plaintext gRPC; this tier has TLS (use http)" $i $tier.name) -}}
{{- end -}}
{{- if $tier.parent -}}
{{- $parent := dict -}}
{{- range $.Values.tiers -}}{{- if eq .name $tier.parent -}}{{- $parent = . -}}{{- end -}}{{- end -}}
{{- if and (include "sluice.tierTLS" (dict "root" $ "tier" $parent) | fromYaml).secretName (not $tls.secretName) -}}
{{- fail (printf "tiers[%d] (%s): its parent %s uses TLS, so it needs tls.secretName (its ca.crt verifies the parent)" $i $tier.name $tier.parent) -}}
{{- end -}}
{{- end -}}
{{- if and $.Values.rateLimitService.enabled (hasKey $.Values.rateLimitService.files (include "sluice.checkedConfig" $tier.name)) -}}
{{- fail (printf "rateLimitService.files: %q is the configuration check's name for tier %s's configuration" (include "sluice.checkedConfig" $tier.name) $tier.name) -}}
{{- end -}}
{{- if and $tier.policies (not $.Values.identity.enabled) -}}
{{- fail (printf "tiers[%d] (%s): policies are written with the chart's own, which need identity.enabled; without it, put them in config" $i $tier.name) -}}
{{- end -}}
{{- if and $.Values.identity.enabled $tier.config (hasKey (fromYaml $tier.config) "policies") -}}
{{- fail (printf "tiers[%d] (%s): with identity.enabled the chart writes the policies: put this tier's own in tiers[%d].policies, not in config" $i $tier.name $i) -}}
{{- end -}}
{{- $seen = append $seen $tier.name -}}
{{- end -}}
{{- if not (has (include "sluice.sidecarTier" .) $seen) -}}
{{- fail (printf "sidecar.tier: no tier named %q" .Values.sidecar.tier) -}}
{{- end -}}
{{- end -}}

{{/*
The sidecar container, as `sluice-sidecar inject` adds it: list it first under initContainers
when "sluice.nativeSidecar" says so, else first under containers, together with the volume of
"sluice.sidecarVolume". Called with (dict "root" $).
*/}}
{{- define "sluice.sidecar" -}}
{{- $v := .root.Values -}}
- name: sluice-sidecar
  image: {{ include "sluice.image" .root }}
  command:
  - /usr/local/bin/sluice-sidecar
  args:
  - --config
  - /etc/sluice/sidecar.yaml
  - --admin-addr
  - $(POD_IP):9901
  - --debug-addr
  - 127.0.0.1:9902
  - --log-format
  - json
  - --server-addresses
  - {{ include "sluice.tierAddress" (dict "root" .root "tier" (include "sluice.sidecarTier" .root)) }}
  {{- if $v.identity.enabled }}
  - --server-tls-ca
  - {{ include "sluice.identityDir" . }}/ca.crt
  - --server-tls-cert
  - {{ include "sluice.identityDir" . }}/tls.crt
  - --server-tls-key
  - {{ include "sluice.identityDir" . }}/tls.key
  {{- end }}
  env:
  - name: POD_NAME
    valueFrom:
      fieldRef:
        apiVersion: v1
        fieldPath: metadata.name
  - name: POD_IP
    valueFrom:
      fieldRef:
        apiVersion: v1
        fieldPath: status.podIP
  ports:
  - name: sluice-admin
    containerPort: 9901
    protocol: TCP
  startupProbe:
    httpGet:
      path: /ready
      port: sluice-admin
    periodSeconds: 1
    failureThreshold: 60
  livenessProbe:
    httpGet:
      path: /live
      port: sluice-admin
    periodSeconds: 10
    failureThreshold: 3
  resources:
    requests:
      cpu: {{ $v.sidecar.resources.requests.cpu }}
      memory: {{ $v.sidecar.resources.requests.memory }}
    limits:
      {{- with $v.sidecar.resources.limits.cpu }}
      cpu: {{ . }}
      {{- end }}
      memory: {{ $v.sidecar.resources.limits.memory }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    runAsGroup: 65532
    readOnlyRootFilesystem: true
    allowPrivilegeEscalation: false
    capabilities:
      drop:
      - ALL
    seccompProfile:
      type: RuntimeDefault
  volumeMounts:
  - name: sluice-config
    mountPath: /etc/sluice
    readOnly: true
  - name: sluice-config
    mountPath: /var/run/secrets/kubernetes.io/serviceaccount
    readOnly: true
  {{- if $v.identity.enabled }}
  - name: sluice-identity
    mountPath: {{ include "sluice.identityDir" . }}
    readOnly: true
  {{- end }}
  {{- if include "sluice.nativeSidecar" .root }}
  restartPolicy: Always
  {{- else }}
  lifecycle:
    postStart:
      exec:
        command:
        - /usr/local/bin/sluice-sidecar
        - wait
  {{- end }}
{{- end -}}

{{/*
"true" when pods rendered by the chart get a native sidecar: sidecar.native true, or auto on a
cluster of 1.29 or later (what `helm install` reports; `helm template` assumes its own default
unless given --kube-version). Empty for a classic one.
*/}}
{{- define "sluice.nativeSidecar" -}}
{{- $native := toString .Values.sidecar.native -}}
{{- if or (eq $native "true") (and (eq $native "auto") (semverCompare ">=1.29-0" .Capabilities.KubeVersion.Version)) -}}
true
{{- end -}}
{{- end -}}

{{/*
The sidecar's volumes: (dict "configMap" NAME "root" $): its configuration, and with
identity.enabled its certificate ("sluice.identityVolume").
*/}}
{{- define "sluice.sidecarVolume" -}}
- name: sluice-config
  configMap:
    name: {{ .configMap }}
    items:
    - key: sidecar.yaml
      path: sidecar.yaml
{{- if and .root .root.Values.identity.enabled }}
{{ include "sluice.identityVolume" . }}
{{- end }}
{{- end -}}

{{/* Where a sidecar reads its certificate, as `inject` mounts it. */}}
{{- define "sluice.identityDir" -}}
/var/run/secrets/sluice.io/identity
{{- end -}}

{{/*
The pod's certificate from cert-manager's CSI driver, as `inject --identity-issuer` adds it: its
URI SAN the pod's SPIFFE id, which the driver completes with the pod's namespace and name.
(dict "root" $).
*/}}
{{- define "sluice.identityVolume" -}}
{{- $issuer := include "sluice.identityIssuer" .root | fromYaml -}}
- name: sluice-identity
  csi:
    driver: csi.cert-manager.io
    readOnly: true
    volumeAttributes:
      csi.cert-manager.io/common-name: ${POD_NAME}
      csi.cert-manager.io/fs-group: "65532"
      {{- with $issuer.group }}
      csi.cert-manager.io/issuer-group: {{ . }}
      {{- end }}
      csi.cert-manager.io/issuer-kind: {{ $issuer.kind }}
      csi.cert-manager.io/issuer-name: {{ $issuer.name }}
      csi.cert-manager.io/key-usages: digital signature,key encipherment,client auth
      csi.cert-manager.io/uri-sans: spiffe://{{ .root.Values.identity.trustDomain }}/ns/${POD_NAMESPACE}/pod/${POD_NAME}
{{- end -}}

{{/*
The issuer of the identities (name, kind, group as YAML): identity.issuerRef, or the chart's CA
ClusterIssuer (identity.yaml). A ClusterIssuer, since cert-manager's CSI driver asks for a pod's
certificate in the pod's own namespace.
*/}}
{{- define "sluice.identityIssuer" -}}
{{- $ref := .Values.identity.issuerRef -}}
{{- if $ref.name -}}
{{- toYaml (dict "name" $ref.name "kind" ($ref.kind | default "ClusterIssuer") "group" ($ref.group | default "")) -}}
{{- else -}}
{{- toYaml (dict "name" (printf "%s-%s-identity" (include "sluice.fullname" .) .Release.Namespace) "kind" "ClusterIssuer" "group" "") -}}
{{- end -}}
{{- end -}}

{{/*
A tier's TLS (secretName, clientAuth as YAML): its tls value; with identity.enabled, mTLS, from
the tier's identity Certificate's Secret unless tls.secretName names another. (dict "root" $
"tier" TIER).
*/}}
{{- define "sluice.tierTLS" -}}
{{- $tls := deepCopy (.tier.tls | default dict) -}}
{{- if .root.Values.identity.enabled -}}
{{- $_ := set $tls "clientAuth" true -}}
{{- if not $tls.secretName -}}
{{- $_ := set $tls "secretName" (printf "%s-identity" (include "sluice.tierName" (dict "root" .root "tier" .tier.name))) -}}
{{- end -}}
{{- end -}}
{{- toYaml $tls -}}
{{- end -}}

{{/*
A tier's configuration as its servers read it: its config, and with identity.enabled the
policies after it: the tier's own (tiers[].policies), then the pods' (client ids under their own
name), then each child tier's (GetServerCapacity). (dict "root" $ "tier" TIER).
*/}}
{{- define "sluice.tierConfig" -}}
{{- $id := .root.Values.identity -}}
{{- if not $id.enabled -}}
{{- .tier.config -}}
{{- else -}}
{{- $domain := printf "spiffe://%s/ns" $id.trustDomain -}}
{{- $policies := concat (.tier.policies | default list) (list (dict "identity" (printf "%s/*/pod/*" $domain) "client_ids" (list "{2}:*") "resources" $id.podResources "max_client_ids" (int $id.podClientIds))) -}}
{{- range .root.Values.tiers -}}
{{- if eq (.parent | default "") $.tier.name -}}
{{- $policies = append $policies (dict "identity" (printf "%s/%s/tier/%s" $domain $.root.Release.Namespace .name) "client_ids" (list "*") "server_capacity" true) -}}
{{- end -}}
{{- end -}}
{{- .tier.config | trimSuffix "\n" }}
# Written by the chart (identity.enabled): the first policy whose identity matches applies.
{{ toYaml (dict "policies" $policies) }}
{{- end -}}
{{- end -}}

{{/* An issuerRef to (dict "name" "kind" "group"); kind defaults to Issuer. */}}
{{- define "sluice.issuerRef" -}}
issuerRef:
  name: {{ .name }}
  kind: {{ .kind | default "Issuer" }}
  {{- with .group }}
  group: {{ . }}
  {{- end }}
{{- end -}}

{{/* A self-signed Issuer: (dict "root" $ "name" NAME "namespace" NS "component" COMPONENT). */}}
{{- define "sluice.selfSignedIssuer" -}}
apiVersion: cert-manager.io/v1
kind: Issuer
metadata:
  name: {{ .name }}
  namespace: {{ .namespace }}
  labels:
    {{- include "sluice.labels" .root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  selfSigned: {}
{{- end -}}

{{/* A tier's configuration's file name (and key) in the configuration check: (tier name). */}}
{{- define "sluice.checkedConfig" -}}
{{ . }}.server.yaml
{{- end -}}

{{/* The webhook's certificate Secret's name. */}}
{{- define "sluice.injectorSecret" -}}
{{ include "sluice.fullname" . }}-injector-tls
{{- end -}}

{{/*
What follows takes (dict "root" $ ... "match" LABELS), LABELS the labels that, beside
"sluice.selector", pick one component's pods (a tier's, the webhook's).
*/}}

{{/* The component's pods spread over nodes and zones, as server.topologySpread says. */}}
{{- define "sluice.topologySpread" -}}
{{- $t := .root.Values.server.topologySpread -}}
{{- if $t.enabled -}}
topologySpreadConstraints:
{{- range $t.topologyKeys }}
  - maxSkew: {{ $t.maxSkew }}
    topologyKey: {{ . }}
    whenUnsatisfiable: {{ $t.whenUnsatisfiable }}
    labelSelector:
      matchLabels:
        {{- include "sluice.selector" $.root | nindent 8 }}
        {{- toYaml $.match | nindent 8 }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* A PodDisruptionBudget for the component: also "name" and "maxUnavailable". */}}
{{- define "sluice.podDisruptionBudget" -}}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ .name }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "sluice.labels" .root | nindent 4 }}
    {{- toYaml .match | nindent 4 }}
spec:
  maxUnavailable: {{ .maxUnavailable }}
  selector:
    matchLabels:
      {{- include "sluice.selector" .root | nindent 6 }}
      {{- toYaml .match | nindent 6 }}
{{- end -}}
