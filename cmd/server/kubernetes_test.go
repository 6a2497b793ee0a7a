package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goccy/go-yaml"

	"github.com/replayguard/replayguard/token"
)

// The Kubernetes example (examples/kubernetes), checked without a
// cluster: its manifests parse, its probes, ports and secret references
// fit together, and its environment is one the server reads and loads.

const k8sDir = composeRepoRoot + "/examples/kubernetes"

// k8sObject is the part of a Kubernetes object the tests read, for the
// kinds the example has (StatefulSet, Service, Secret).
type k8sObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	// Secret
	Data       map[string]string `yaml:"data"`
	StringData map[string]string `yaml:"stringData"`
	// Kustomization
	Resources []string `yaml:"resources"`
	Spec      struct {
		// Service
		ClusterIP string           `yaml:"clusterIP"`
		Selector  any              `yaml:"selector"`
		Ports     []k8sServicePort `yaml:"ports"`
		// StatefulSet
		ServiceName string `yaml:"serviceName"`
		Replicas    int    `yaml:"replicas"`
		Template    struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec k8sPodSpec `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type k8sServicePort struct {
	Name       string `yaml:"name"`
	Port       int    `yaml:"port"`
	TargetPort any    `yaml:"targetPort"`
}

type k8sPodSpec struct {
	TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               struct {
		RunAsNonRoot bool `yaml:"runAsNonRoot"`
		RunAsUser    int  `yaml:"runAsUser"`
		FSGroup      int  `yaml:"fsGroup"`
	} `yaml:"securityContext"`
	Containers []k8sContainer `yaml:"containers"`
	Volumes    []struct {
		Name   string `yaml:"name"`
		Secret *struct {
			SecretName  string `yaml:"secretName"`
			DefaultMode int    `yaml:"defaultMode"`
			Items       []struct {
				Key  string `yaml:"key"`
				Path string `yaml:"path"`
			} `yaml:"items"`
		} `yaml:"secret"`
	} `yaml:"volumes"`
}

type k8sContainer struct {
	Name  string `yaml:"name"`
	Image string `yaml:"image"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	Env []struct {
		Name      string  `yaml:"name"`
		Value     *string `yaml:"value"`
		ValueFrom *struct {
			FieldRef *struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef"`
			SecretKeyRef *struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"`
	} `yaml:"httpGet"`
}

// loadK8s parses every YAML document of every manifest in k8sDir, by kind.
func loadK8s(t *testing.T) (byKind map[string][]k8sObject, files []string) {
	t.Helper()
	byKind = map[string][]k8sObject{}
	names, err := filepath.Glob(filepath.Join(k8sDir, "*.yaml"))
	if err != nil || len(names) == 0 {
		t.Fatalf("no manifests in %s: %v", k8sDir, err)
	}
	for _, name := range names {
		files = append(files, filepath.Base(name))
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(f)
		for {
			var o k8sObject
			err := dec.Decode(&o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if o.Kind == "" || o.APIVersion == "" {
				t.Errorf("%s: a document without kind or apiVersion", name)
			}
			byKind[o.Kind] = append(byKind[o.Kind], o)
		}
		f.Close()
	}
	return byKind, files
}

// k8sSelects reports whether selector (a Service's map) selects a pod
// with labels.
func k8sSelects(selector any, labels map[string]string) bool {
	m, ok := selector.(map[string]any)
	if !ok || len(m) == 0 {
		return false
	}
	for k, v := range m {
		if labels[k] != fmt.Sprint(v) {
			return false
		}
	}
	return true
}

func TestKubernetesExample(t *testing.T) {
	objs, files := loadK8s(t)
	if len(objs["StatefulSet"]) != 1 {
		t.Fatalf("%d StatefulSets, want 1", len(objs["StatefulSet"]))
	}
	sts := objs["StatefulSet"][0]
	pod := sts.Spec.Template.Spec
	labels := sts.Spec.Template.Metadata.Labels
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	secrets := map[string]k8sObject{}
	for _, s := range objs["Secret"] {
		secrets[s.Metadata.Name] = s
	}

	// The container's ports by name, and the port the server listens on.
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	env := map[string]string{}
	for _, e := range c.Env {
		if e.Value != nil {
			env[e.Name] = *e.Value
		}
	}
	listen, err := strconv.Atoi(composeContainerPort(t, env["REPLAYGUARD_ADDR"]))
	if err != nil {
		t.Fatalf("REPLAYGUARD_ADDR %q: %v", env["REPLAYGUARD_ADDR"], err)
	}
	resolve := func(port any) int { // a port by number or by name
		if n, err := strconv.Atoi(fmt.Sprint(port)); err == nil {
			return n
		}
		return ports[fmt.Sprint(port)]
	}

	t.Run("the container listens on the port it declares", func(t *testing.T) {
		if ports["http"] == 0 || ports["http"] != listen {
			t.Errorf("container port http = %d, the server listens on %d", ports["http"], listen)
		}
	})

	t.Run("liveness is /healthz and readiness /readyz", func(t *testing.T) {
		for _, p := range []struct {
			name  string
			probe *k8sProbe
			path  string
		}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
			if p.probe == nil || p.probe.HTTPGet == nil {
				t.Errorf("no %s httpGet probe", p.name)
				continue
			}
			if p.probe.HTTPGet.Path != p.path || resolve(p.probe.HTTPGet.Port) != listen {
				t.Errorf("%s probe GET %s on port %v, want %s on %d", p.name, p.probe.HTTPGet.Path, p.probe.HTTPGet.Port, p.path, listen)
			}
		}
	})

	t.Run("the Services select the pods and reach the server's port", func(t *testing.T) {
		var headless, clusterIP bool
		for _, s := range objs["Service"] {
			if !k8sSelects(s.Spec.Selector, labels) {
				t.Errorf("Service %s does not select the pods (labels %v)", s.Metadata.Name, labels)
			}
			for _, p := range s.Spec.Ports {
				if resolve(p.TargetPort) != listen {
					t.Errorf("Service %s port %d targets %v, not the server's port %d", s.Metadata.Name, p.Port, p.TargetPort, listen)
				}
			}
			if s.Spec.ClusterIP == "None" {
				headless = headless || s.Metadata.Name == sts.Spec.ServiceName
			} else {
				clusterIP = true
			}
		}
		if !headless {
			t.Errorf("no headless Service named %q, the StatefulSet's serviceName", sts.Spec.ServiceName)
		}
		if !clusterIP {
			t.Error("no Service for clients")
		}
	})

	t.Run("every variable is one the server reads", func(t *testing.T) {
		known := envNames()
		for _, e := range c.Env {
			if !slices.Contains(known, e.Name) {
				t.Errorf("the container sets %s, which the server does not read", e.Name)
			}
		}
	})

	t.Run("machine IDs come from the pod ordinal", func(t *testing.T) {
		if sts.Spec.Replicas < 2 {
			t.Errorf("%d replicas: the example is of several", sts.Spec.Replicas)
		}
		for _, e := range c.Env {
			if e.Name != "REPLAYGUARD_MACHINE_ID" {
				continue
			}
			if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil ||
				e.ValueFrom.FieldRef.FieldPath != "metadata.labels['apps.kubernetes.io/pod-index']" {
				t.Errorf("REPLAYGUARD_MACHINE_ID is not the pod-index label: %+v", e)
			}
			return
		}
		t.Error("REPLAYGUARD_MACHINE_ID is not set")
	})

	t.Run("secrets are files from the Secret, never values", func(t *testing.T) {
		for _, s := range settings {
			if s.secret {
				if _, inline := env[s.env]; inline {
					t.Errorf("%s is set by value in the manifest", s.env)
				}
			}
		}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				ref := e.ValueFrom.SecretKeyRef
				if _, ok := k8sSecretValue(secrets[ref.Name], ref.Key); !ok {
					t.Errorf("%s refers to key %s of Secret %s, which has none", e.Name, ref.Key, ref.Name)
				}
			}
			if !strings.HasSuffix(e.Name, "_FILE") {
				continue
			}
			if _, ok := k8sSecretFile(t, pod, c, secrets, env[e.Name]); !ok {
				t.Errorf("%s = %q is not a key of a mounted Secret", e.Name, env[e.Name])
			}
		}
		for _, want := range []string{"REPLAYGUARD_SIGNING_KEYS_FILE", "REPLAYGUARD_API_KEYS_FILE"} {
			if env[want] == "" {
				t.Errorf("%s is not set", want)
			}
		}
	})

	t.Run("the Secret as shipped does not run", func(t *testing.T) {
		// Its placeholders must be replaced: a signing key that does not
		// parse stops the server at start.
		v, _ := k8sSecretValue(secrets["replayguard"], "signing-keys")
		if _, err := token.ParseKeys(v); err == nil {
			t.Errorf("the example's signing key %q parses: a copied example would run with a published key", v)
		}
	})

	t.Run("its environment loads", func(t *testing.T) {
		dir := t.TempDir()
		real := map[string]string{
			"signing-keys": composeSecretValues["signing_keys"],
			"api-keys":     "backend-key",
			"redis-url":    "redis://:pw@redis:6379/0",
		}
		vals := map[string]string{"REPLAYGUARD_MACHINE_ID": "2"} // the pod-index label of replayguard-2
		for name, v := range env {
			if strings.HasSuffix(name, "_FILE") {
				key := path.Base(v)
				v = filepath.Join(dir, key)
				if err := os.WriteFile(v, []byte(real[key]+"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			vals[name] = v
		}
		cfg, err := loadConfig(nil, func(k string) string { return vals[k] })
		if err != nil {
			t.Fatalf("the pod's environment does not load: %v", err)
		}
		if cfg.RedisURL == nil || len(cfg.SigningKeys) == 0 || len(cfg.APIKeys) == 0 || cfg.MachineID == nil || *cfg.MachineID != 2 || cfg.LoopbackOnly {
			t.Errorf("loaded %+v: want Redis, keys, machine ID 2, every interface", cfg)
		}
	})

	t.Run("the pod stops within its grace period and runs as non-root", func(t *testing.T) {
		if time.Duration(pod.TerminationGracePeriodSeconds)*time.Second <= defaultShutdownTimeout {
			t.Errorf("terminationGracePeriodSeconds %d, want above REPLAYGUARD_SHUTDOWN_TIMEOUT's %v", pod.TerminationGracePeriodSeconds, defaultShutdownTimeout)
		}
		if !pod.SecurityContext.RunAsNonRoot || pod.SecurityContext.RunAsUser == 0 {
			t.Errorf("securityContext %+v: want runAsNonRoot and a non-root runAsUser", pod.SecurityContext)
		}
	})

	t.Run("the kustomization lists every manifest", func(t *testing.T) {
		ks := objs["Kustomization"]
		if len(ks) != 1 {
			t.Fatalf("%d Kustomizations, want 1", len(ks))
		}
		for _, f := range files {
			if f != "kustomization.yaml" && !slices.Contains(ks[0].Resources, f) {
				t.Errorf("kustomization.yaml does not list %s", f)
			}
		}
	})
}

// k8sSecretValue is key's value in Secret s, from stringData or data.
func k8sSecretValue(s k8sObject, key string) (string, bool) {
	if v, ok := s.StringData[key]; ok {
		return v, true
	}
	v, ok := s.Data[key]
	return v, ok
}

// k8sSecretFile finds the Secret key that file is in container c of pod:
// a mount of a secret volume whose directory holds file as one of the
// Secret's keys (or items).
func k8sSecretFile(t *testing.T, pod k8sPodSpec, c k8sContainer, secrets map[string]k8sObject, file string) (string, bool) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/")
		if !ok {
			continue
		}
		if !m.ReadOnly {
			t.Errorf("mount %s is writable", m.MountPath)
		}
		for _, v := range pod.Volumes {
			if v.Name != m.Name || v.Secret == nil {
				continue
			}
			s, ok := secrets[v.Secret.SecretName]
			if !ok {
				t.Errorf("volume %s mounts Secret %s, which the example does not define", v.Name, v.Secret.SecretName)
				return "", false
			}
			key := rel
			for _, it := range v.Secret.Items {
				if it.Path == rel {
					key = it.Key
				}
			}
			if _, ok := k8sSecretValue(s, key); ok {
				return key, true
			}
		}
	}
	return "", false
}
