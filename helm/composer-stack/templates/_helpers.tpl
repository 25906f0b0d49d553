{{/* Names, labels and the pieces every workload shares. */}}

{{- define "composer-stack.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Name of a component's objects: (list $ "gateway") */}}
{{- define "composer-stack.componentName" -}}
{{- $root := index . 0 -}}
{{- printf "%s-%s" (include "composer-stack.fullname" $root) (index . 1) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "composer-stack.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ $root.Chart.Name }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "composer-stack.labels" -}}
{{- $root := index . 0 -}}
{{ include "composer-stack.selectorLabels" . }}
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
app.kubernetes.io/part-of: composer-stack
helm.sh/chart: {{ printf "%s-%s" $root.Chart.Name $root.Chart.Version }}
{{- end -}}

{{- define "composer-stack.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "composer-stack.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* image reference from an image block: (list $ .Values.image) */}}
{{- define "composer-stack.image" -}}
{{- $root := index . 0 -}}
{{- $image := index . 1 -}}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) -}}
{{- end -}}

{{/* The Secret holding the admin and Stripe tokens (and the in-chart database password). */}}
{{- define "composer-stack.secretName" -}}
{{- default (include "composer-stack.componentName" (list . "secrets")) .Values.secrets.existingSecret -}}
{{- end -}}

{{- define "composer-stack.secretEnv" -}}
{{- $root := index . 0 -}}
- name: {{ index . 1 }}
  valueFrom:
    secretKeyRef:
      name: {{ include "composer-stack.secretName" $root }}
      key: {{ index $root.Values.secrets.keys (index . 2) }}
{{- end -}}

{{/*
CSTACK_REDIS_URL with its password: the in-chart Valkey's URL built from the password in
the Secret (Kubernetes expands $(REDIS_PASSWORD), so the value never appears in the pod
spec), or the URL in an existing Secret. redis-py and Celery read the password from it.
*/}}
{{- define "composer-stack.redisEnv" -}}
{{- if .Values.redis.enabled }}
{{ include "composer-stack.secretEnv" (list . "REDIS_PASSWORD" "redisPassword") }}
- name: CSTACK_REDIS_URL
  value: {{ printf "redis://:$(REDIS_PASSWORD)@%s:%d/0" (include "composer-stack.componentName" (list . "redis")) (int .Values.redis.port) | quote }}
{{- else }}
- name: CSTACK_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ required "redis.external.existingSecret is required when redis.enabled is false" .Values.redis.external.existingSecret }}
      key: {{ .Values.redis.external.key }}
{{- with .Values.redis.external.celeryBrokerKey }}
- name: CSTACK_CELERY_BROKER_URL
  valueFrom:
    secretKeyRef:
      name: {{ $.Values.redis.external.existingSecret }}
      key: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
CSTACK_REDIS_URL of the training pods (rollout workers, trainer): their Celery queue and
trajectory stream, on the single Redis of redis.external.celeryBrokerKey when the state
Redis is a cluster, else the same Redis as the rest.
*/}}
{{- define "composer-stack.queueRedisEnv" -}}
{{- if and (not .Values.redis.enabled) .Values.redis.external.celeryBrokerKey }}
- name: CSTACK_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ required "redis.external.existingSecret is required when redis.enabled is false" .Values.redis.external.existingSecret }}
      key: {{ .Values.redis.external.celeryBrokerKey }}
{{- else }}
{{ include "composer-stack.redisEnv" . }}
{{- end }}
{{- end -}}

{{/* The CA of a TLS Redis (redis.tls.caSecret), for every pod that talks to Redis. */}}
{{- define "composer-stack.redisCaVolume" -}}
{{- with .Values.redis.tls.caSecret }}
- name: redis-ca
  secret:
    secretName: {{ . }}
{{- end }}
{{- end -}}

{{- define "composer-stack.redisCaMount" -}}
{{- if .Values.redis.tls.caSecret }}
- name: redis-ca
  mountPath: /etc/cstack/redis-ca
  readOnly: true
{{- end }}
{{- end -}}

{{/* What billing reads (in the gateway's meter, the worker and beat): Redis, the ledger, the price book. */}}
{{- define "composer-stack.billingEnv" -}}
{{ include "composer-stack.redisEnv" . }}
{{- if .Values.postgresql.enabled }}
{{ include "composer-stack.secretEnv" (list . "LEDGER_DB_PASSWORD" "postgresPassword") }}
- name: CSTACK_LEDGER_URL
  value: {{ printf "postgresql+psycopg://%s:$(LEDGER_DB_PASSWORD)@%s:%d/%s" .Values.postgresql.username (include "composer-stack.componentName" (list . "postgresql")) (int .Values.postgresql.port) .Values.postgresql.database | quote }}
{{- else }}
- name: CSTACK_LEDGER_URL
  valueFrom:
    secretKeyRef:
      name: {{ required "postgresql.external.existingSecret is required when postgresql.enabled is false" .Values.postgresql.external.existingSecret }}
      key: {{ .Values.postgresql.external.key }}
{{- end }}
- name: CSTACK_PRICEBOOK_PATH
  value: {{ printf "%s/pricebook.yaml" .Values.pricebook.mountPath | quote }}
{{- end -}}

{{/* Extra plain env from a values map, sorted so renders are stable. */}}
{{- define "composer-stack.extraEnv" -}}
{{- range $name, $value := . }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end -}}

{{- define "composer-stack.pricebookVolume" -}}
- name: pricebook
  configMap:
    name: {{ default (include "composer-stack.componentName" (list . "pricebook")) .Values.pricebook.existingConfigMap }}
{{- end -}}

{{- define "composer-stack.pricebookMount" -}}
- name: pricebook
  mountPath: {{ .Values.pricebook.mountPath }}
  readOnly: true
{{- end -}}

{{/* The upstream URL of a tier's vLLM pool (its Service). */}}
{{- define "composer-stack.vllmUrl" -}}
{{- $root := index . 0 -}}
{{- printf "http://%s:%d" (include "composer-stack.componentName" (list $root (printf "vllm-%s" (index . 1)))) (int $root.Values.vllm.port) -}}
{{- end -}}

{{/* A tier's headless Service: its name resolves to every ready replica (weight sync). */}}
{{- define "composer-stack.vllmReplicasUrl" -}}
{{- $root := index . 0 -}}
{{- printf "http://%s:%d" (include "composer-stack.componentName" (list $root (printf "vllm-%s-replicas" (index . 1)))) (int $root.Values.vllm.port) -}}
{{- end -}}

{{/*
vLLM engine arguments of a tier, as a JSON list of flags: the tier's variant from
files/variants.yaml (a symlink to serving/variants.yaml) with the profile
overlaid, a null in the profile removing an argument -- the same rules as
serving.variants.VariantBook.cli_args, so the chart and `cstack serve` cannot drift.
Helm's maps iterate in key order, so flags come out sorted by name.
*/}}
{{- define "composer-stack.vllmEngineArgs" -}}
{{- $root := index . 0 -}}
{{- $tier := index . 1 -}}
{{- $args := include "composer-stack.vllmMergedArgs" (list $root $tier) | fromJson -}}
{{- $flags := list -}}
{{- range $key, $value := $args -}}
{{- $flag := printf "--%s" $key -}}
{{- if kindIs "bool" $value -}}
{{- $flags = append $flags (ternary $flag (printf "--no-%s" $key) $value) -}}
{{- else if kindIs "string" $value -}}
{{- $flags = concat $flags (list $flag $value) -}}
{{- else -}}
{{- $flags = concat $flags (list $flag (toJson $value)) -}}
{{- end -}}
{{- end -}}
{{- toJson $flags -}}
{{- end -}}

{{- define "composer-stack.vllmMergedArgs" -}}
{{- $root := index . 0 -}}
{{- $tier := index . 1 -}}
{{- $book := $root.Files.Get "files/variants.yaml" | fromYaml -}}
{{- $variant := index $book.variants $tier -}}
{{- if not $variant -}}
{{- fail (printf "files/variants.yaml has no variant %q" $tier) -}}
{{- end -}}
{{- if not (hasKey $book.profiles $root.Values.vllm.profile) -}}
{{- fail (printf "vllm.profile: files/variants.yaml has no profile %q (known: %s)" $root.Values.vllm.profile (keys $book.profiles | sortAlpha | join ", ")) -}}
{{- end -}}
{{- $args := deepCopy (default dict $variant.engine_args) -}}
{{- range $key, $value := (default dict (index $book.profiles $root.Values.vllm.profile)) -}}
{{- if kindIs "invalid" $value -}}
{{- $_ := unset $args $key -}}
{{- else -}}
{{- $_ := set $args $key $value -}}
{{- end -}}
{{- end -}}
{{- if $root.Values.trainer.enabled -}}
{{- /* The trainer pushes weights live: the variants file's weight_sync arguments. */ -}}
{{- range $key, $value := (default dict $book.weight_sync.engine_args) -}}
{{- $_ := set $args $key $value -}}
{{- end -}}
{{- /* And those of its serving profile (the reference CPU MLA backend on cpu). */ -}}
{{- range $key, $value := (default dict (index (default dict $book.weight_sync.profiles) $root.Values.vllm.profile)) -}}
{{- $_ := set $args $key $value -}}
{{- end -}}
{{- end -}}
{{- toJson $args -}}
{{- end -}}

{{/* served_model_name from the variants file. */}}
{{- define "composer-stack.servedModelName" -}}
{{- $book := .Files.Get "files/variants.yaml" | fromYaml -}}
{{- default "composer-2.5" $book.served_model_name -}}
{{- end -}}

{{/* GPUs a tier's pod needs: explicit, or tensor x pipeline parallel size. */}}
{{- define "composer-stack.vllmGpus" -}}
{{- $root := index . 0 -}}
{{- $tier := index . 1 -}}
{{- $spec := index $root.Values.vllm.tiers $tier -}}
{{- if gt (int $spec.gpus) 0 -}}
{{- int $spec.gpus -}}
{{- else -}}
{{- $args := include "composer-stack.vllmMergedArgs" (list $root $tier) | fromJson -}}
{{- mul (int (default 1 (index $args "tensor-parallel-size"))) (int (default 1 (index $args "pipeline-parallel-size"))) -}}
{{- end -}}
{{- end -}}

{{/* Port name of a worker process's /metrics: `metrics`, then `metrics-1`, `metrics-2`... */}}
{{- define "composer-stack.metricsPortName" -}}
{{- if eq (int .) 0 -}}metrics{{- else -}}{{ printf "metrics-%d" (int .) }}{{- end -}}
{{- end -}}
