#include "interop/msprobe_record.h"

namespace lockstep::collector::msprobe {
namespace {

using Token = JsonStream::Token;

// A statistic: a number, or NaN for null / a string (md5 mode writes none of them).
Status ReadStat(JsonStream* js, double* out, bool* has) {
  Token t;
  if (Status s = js->Next(&t); !s.ok()) return s;
  if (t == Token::kNumber) {
    *out = js->number();
    *has = true;
    return Status::OK();
  }
  return js->Skip(t);
}

}  // namespace

Status ReadValue(JsonStream* js, Token first, Value* out) {
  out->items.clear();
  switch (first) {
    case Token::kBeginArray: {
      out->type = Value::Type::kList;
      for (;;) {
        Token t;
        if (Status s = js->Next(&t); !s.ok()) return s;
        if (t == Token::kEndArray) return Status::OK();
        out->items.emplace_back();
        if (Status s = ReadValue(js, t, &out->items.back().second); !s.ok()) return s;
      }
    }
    case Token::kBeginObject: {
      std::string type;
      bool typed = false;
      for (;;) {
        Token t;
        if (Status s = js->Next(&t); !s.ok()) return s;
        if (t == Token::kEndObject) break;
        // t is a key
        const std::string& key = js->text();
        if (key == "type" || key == "dtype" || key == "data_name") {
          const bool is_type = key == "type", is_dtype = key == "dtype";
          if (Status s = js->Next(&t); !s.ok()) return s;
          if (t == Token::kString) {
            if (is_type) {
              type = js->text();
              typed = true;
            } else if (is_dtype) {
              out->tensor.dtype = js->text();
            } else {
              out->tensor.data_name = js->text();
            }
          } else if (Status s = js->Skip(t); !s.ok()) {
            return s;
          }
        } else if (key == "shape") {
          if (Status s = js->Next(&t); !s.ok()) return s;
          if (t != Token::kBeginArray) {
            if (Status s = js->Skip(t); !s.ok()) return s;
            continue;
          }
          out->tensor.shape.clear();
          for (;;) {
            if (Status s = js->Next(&t); !s.ok()) return s;
            if (t == Token::kEndArray) break;
            if (t == Token::kNumber) {
              // A dimension out of int64's range (a damaged file) reads as -1: no elements.
              const double d = js->number();
              out->tensor.shape.push_back(d >= 0 && d < 9.2e18 ? static_cast<int64_t>(d) : -1);
            } else if (Status s = js->Skip(t); !s.ok()) {
              return s;
            }
          }
        } else if (key == "Max") {
          if (Status s = ReadStat(js, &out->tensor.max, &out->tensor.has_stats); !s.ok()) return s;
        } else if (key == "Min") {
          if (Status s = ReadStat(js, &out->tensor.min, &out->tensor.has_stats); !s.ok()) return s;
        } else if (key == "Mean") {
          if (Status s = ReadStat(js, &out->tensor.mean, &out->tensor.has_stats); !s.ok()) return s;
        } else if (key == "Norm") {
          if (Status s = ReadStat(js, &out->tensor.norm, &out->tensor.has_stats); !s.ok()) return s;
        } else if (key == "requires_grad") {
          if (Status s = js->Next(&t); !s.ok()) return s;
          out->tensor.requires_grad = t == Token::kTrue;
          if (Status s = js->Skip(t); !s.ok()) return s;
        } else {
          out->items.emplace_back(key, Value{});
          if (Status s = js->Next(&t); !s.ok()) return s;
          if (Status s = ReadValue(js, t, &out->items.back().second); !s.ok()) return s;
        }
      }
      if (typed) {
        out->type = type == "torch.Tensor" ? Value::Type::kTensor : Value::Type::kOther;
        if (out->type == Value::Type::kTensor) out->items.clear();
      } else {
        out->type = Value::Type::kDict;
      }
      return Status::OK();
    }
    case Token::kNull:
      out->type = Value::Type::kNone;
      return Status::OK();
    default:
      out->type = Value::Type::kOther;
      return Status::OK();
  }
}

}  // namespace lockstep::collector::msprobe
